// The published API, checked on the built package (run `npm run build` first; `npm run api:check`
// does). Fails when:
//   1. a published .d.ts still mentions `@internal` (stripInternal is off, or the tag sits where
//      TypeScript does not see it);
//   2. the published .d.ts files do not type-check on their own (skipLibCheck off): a public
//      declaration that names an `@internal` one, or an entry that re-exports one, is left
//      dangling once stripInternal removed it;
//   3. an entry's JavaScript exports a value its types do not declare (an `@internal` re-export:
//      reachable at run time though stripped from the types);
//   4. the exported names of an entry point (with their kind, and whether they are deprecated)
//      differ from the committed snapshot api/exports.json;
//   5. package.json's `exports` and `typesVersions` disagree about an entry's types;
//   6. an exported declaration, or a public or protected member of an exported class or
//      interface, has no TSDoc.
// `node scripts/check-api.mjs --update` rewrites the snapshot after a deliberate change of the API:
// review its diff like code (a removed or renamed name breaks users: README, "Entry points and
// stability").
import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { URL, fileURLToPath, pathToFileURL } from 'node:url';
import * as prettier from 'prettier';
import ts from 'typescript';

const root = fileURLToPath(new URL('..', import.meta.url));
const SNAPSHOT = join(root, 'api', 'exports.json');
const update = process.argv.includes('--update');
const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'));
const failures = [];
let namesChanged = false;
const fail = (message) => failures.push(message);
const rel = (path) => relative(root, path);

/** Every entry point with types: subpath → { types, js }, from package.json's `exports`. */
function entryPoints() {
  const entries = {};
  for (const [subpath, target] of Object.entries(pkg.exports)) {
    if (typeof target !== 'object' || target === null || target.types === undefined) continue;
    entries[subpath] = { types: join(root, target.types), js: join(root, target.default) };
    if (subpath === '.') {
      if (join(root, pkg.types) !== entries[subpath].types) {
        fail(`package.json: "types" (${pkg.types}) is not exports["."].types (${target.types})`);
      }
      continue;
    }
    const legacy = pkg.typesVersions?.['*']?.[subpath.slice(2)];
    if (legacy === undefined || join(root, legacy[0]) !== entries[subpath].types) {
      fail(
        `package.json: typesVersions["*"]["${subpath.slice(2)}"] must be ["${target.types}"] ` +
          `like exports["${subpath}"].types (found ${JSON.stringify(legacy)})`,
      );
    }
  }
  return entries;
}

function declarationFiles(dir) {
  return readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) return declarationFiles(path);
    return entry.name.endsWith('.d.ts') ? [path] : [];
  });
}

/** 1. No `@internal` left in what is published. */
function checkNoInternalTag(files) {
  for (const file of files) {
    const lines = readFileSync(file, 'utf8').split('\n');
    lines.forEach((line, i) => {
      if (!/@internal\b/.test(line)) return;
      const declaration = lines.slice(i + 1).find((l) => !/^\s*(\/\*\*|\*)/.test(l)) ?? '';
      fail(
        `${rel(file)}:${i + 1}: publishes an @internal declaration: ${declaration.trim()}\n` +
          '    (is "stripInternal" on in tsconfig.build.json? is the tag in the JSDoc right above it?)',
      );
    });
  }
}

/** 2. The published declarations type-check on their own. */
function compileDeclarations(files) {
  const program = ts.createProgram(files, {
    module: ts.ModuleKind.NodeNext,
    moduleResolution: ts.ModuleResolutionKind.NodeNext,
    target: ts.ScriptTarget.ES2023,
    lib: ['lib.es2023.d.ts', 'lib.esnext.disposable.d.ts'],
    types: ['node'],
    strict: true,
    noEmit: true,
    skipLibCheck: false,
  });
  const dist = join(root, 'dist');
  const diagnostics = ts
    .getPreEmitDiagnostics(program)
    .filter((d) => d.file === undefined || !relative(dist, d.file.fileName).startsWith('..'));
  for (const d of diagnostics) {
    const where =
      d.file === undefined
        ? ''
        : `${rel(d.file.fileName)}:${d.file.getLineAndCharacterOfPosition(d.start ?? 0).line + 1}: `;
    fail(`${where}${ts.flattenDiagnosticMessageText(d.messageText, '\n    ')}`);
  }
  return program;
}

function isDeprecated(node) {
  return node !== undefined && ts.getJSDocTags(node).some((tag) => tag.tagName.text === 'deprecated');
}

function kindOf(symbol) {
  const f = ts.SymbolFlags;
  if (symbol.flags & f.Class) return 'class';
  if (symbol.flags & f.Function) return 'function';
  if (symbol.flags & f.Enum) return 'enum';
  if (symbol.flags & f.Variable) return 'const';
  if (symbol.flags & f.Interface) return 'interface';
  if (symbol.flags & f.TypeAlias) return 'type';
  if (symbol.flags & f.Module) return 'namespace';
  return 'other';
}

/** The names an entry's types export: name → "kind" or "kind, deprecated". */
function typeExports(program, file) {
  const checker = program.getTypeChecker();
  const source = program.getSourceFile(file);
  const moduleSymbol = source && checker.getSymbolAtLocation(source);
  if (moduleSymbol === undefined) {
    fail(`${rel(file)}: not found or not a module (was the package built?)`);
    return {};
  }
  const out = {};
  for (const symbol of checker.getExportsOfModule(moduleSymbol)) {
    const target = symbol.flags & ts.SymbolFlags.Alias ? checker.getAliasedSymbol(symbol) : symbol;
    // The export specifier (`export { /** @deprecated */ x } from …`) or the declaration itself.
    const deprecated = [...(symbol.declarations ?? []), ...(target.declarations ?? [])].some(isDeprecated);
    out[symbol.name] = `${kindOf(target)}${deprecated ? ', deprecated' : ''}`;
  }
  return sorted(out);
}

/** 6. TSDoc on everything an entry exports, and on the members users see. */
function checkTsdoc(program, file, documented) {
  const checker = program.getTypeChecker();
  const source = program.getSourceFile(file);
  const moduleSymbol = source && checker.getSymbolAtLocation(source);
  if (moduleSymbol === undefined) return;
  const hasDoc = (node) => ts.getJSDocCommentsAndTags(node).length > 0;
  const where = (node) => {
    const sf = node.getSourceFile();
    return `${rel(sf.fileName)}:${sf.getLineAndCharacterOfPosition(node.getStart()).line + 1}`;
  };
  for (const symbol of checker.getExportsOfModule(moduleSymbol)) {
    const target = symbol.flags & ts.SymbolFlags.Alias ? checker.getAliasedSymbol(symbol) : symbol;
    for (const declaration of target.declarations ?? []) {
      if (documented.has(declaration)) continue;
      documented.add(declaration);
      // A variable's TSDoc sits on its statement.
      const documentedNode = ts.isVariableDeclaration(declaration) ? declaration.parent.parent : declaration;
      if (!hasDoc(documentedNode)) fail(`${where(declaration)}: ${symbol.name} has no TSDoc`);
      if (!ts.isClassDeclaration(declaration) && !ts.isInterfaceDeclaration(declaration)) continue;
      for (const member of declaration.members) {
        const isPrivate =
          (member.name !== undefined && ts.isPrivateIdentifier(member.name)) ||
          (ts.getCombinedModifierFlags(member) & ts.ModifierFlags.Private) !== 0;
        if (isPrivate || hasDoc(member)) continue;
        const name = ts.isConstructorDeclaration(member)
          ? 'constructor'
          : (member.name?.getText() ?? '(index)');
        fail(`${where(member)}: ${symbol.name}.${name} has no TSDoc`);
      }
    }
  }
}

function sorted(record) {
  return Object.fromEntries(Object.entries(record).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)));
}

const VALUE_KINDS = new Set(['class', 'function', 'enum', 'const', 'namespace']);

async function main() {
  const entries = entryPoints();
  const files = declarationFiles(join(root, 'dist'));
  checkNoInternalTag(files);
  const program = compileDeclarations(files);
  const api = {};
  const documented = new Set();
  for (const [subpath, { types, js }] of Object.entries(entries)) {
    api[subpath] = typeExports(program, types);
    checkTsdoc(program, types, documented);
    // 3. What the JavaScript exports, the types must declare as values.
    const runtime = Object.keys(await import(pathToFileURL(js).href)).sort();
    const declared = Object.entries(api[subpath])
      .filter(([, kind]) => VALUE_KINDS.has(kind.split(',')[0]))
      .map(([name]) => name);
    for (const name of runtime.filter((n) => !declared.includes(n))) {
      fail(
        `"${subpath}": ${rel(js)} exports "${name}" at run time but its types do not ` +
          '(an @internal declaration re-exported by an entry point?)',
      );
    }
    for (const name of declared.filter((n) => !runtime.includes(n))) {
      fail(`"${subpath}": the types declare the value "${name}", which ${rel(js)} does not export`);
    }
  }
  if (update) {
    const text = await prettier.format(JSON.stringify(api, null, 2), { filepath: SNAPSHOT });
    writeFileSync(SNAPSHOT, text);
    console.log(`api: wrote ${rel(SNAPSHOT)}; review its diff`);
  } else {
    // 4. The exported names of every entry point, against the snapshot.
    let snapshot;
    try {
      snapshot = JSON.parse(readFileSync(SNAPSHOT, 'utf8'));
    } catch (err) {
      fail(`${rel(SNAPSHOT)}: cannot be read (${err.message}); create it with npm run api:update`);
    }
    const subpaths = snapshot === undefined ? [] : new Set([...Object.keys(snapshot), ...Object.keys(api)]);
    for (const subpath of subpaths) {
      const before = snapshot[subpath] ?? {};
      const now = api[subpath] ?? {};
      for (const name of new Set([...Object.keys(before), ...Object.keys(now)])) {
        if (before[name] === now[name]) continue;
        const change =
          before[name] === undefined
            ? `added ${name} (${now[name]})`
            : now[name] === undefined
              ? `removed ${name} (${before[name]})`
              : `changed ${name}: ${before[name]} -> ${now[name]}`;
        fail(`"${subpath}": ${change}, unlike ${rel(SNAPSHOT)}`);
        namesChanged = true;
      }
    }
  }
  if (failures.length > 0) {
    console.error(`api: ${failures.length} problem(s) in the published API:`);
    for (const f of failures) console.error(`  ${f}`);
    if (update) console.error(`${rel(SNAPSHOT)} was written all the same: fix the problems above.`);
    if (namesChanged) {
      console.error(
        'A deliberate change of the exported names? Run npm run api:update and commit api/exports.json.',
      );
    }
    process.exit(1);
  }
  const names = Object.values(api).reduce((n, e) => n + Object.keys(e).length, 0);
  console.log(
    `api: ${Object.keys(api).length} entry points, ${names} exported names, ${files.length} declaration files: ok`,
  );
}

await main();
