// A TypeDoc plugin for `npm run docs:api` (issue 38, item 3): every optional property of an
// exported options type (a name ending in `Options`, and the object types nested in its
// properties) states its default with `@defaultValue` — a value, or "none" with what leaving it
// out means. A property without one is a warning, which `treatWarningsAsErrors` makes an error.
import { Converter, ReflectionKind } from 'typedoc';

/** @param {import('typedoc').Application} app */
export function load(app) {
  app.converter.on(Converter.EVENT_RESOLVE_END, (context) => {
    for (const property of context.project.getReflectionsByKind(ReflectionKind.Property)) {
      if (!property.flags.isOptional) continue;
      const chain = [];
      for (let r = property.parent; r !== undefined; r = r.parent) chain.push(r.name);
      if (!chain.some((name) => /Options$/.test(name))) continue;
      if (property.comment?.getTag('@defaultValue') !== undefined) continue;
      app.logger.warn(
        `${property.getFriendlyFullName()} is optional and has no @defaultValue (its default, or "none" and what leaving it out means)`,
      );
    }
  });
}
