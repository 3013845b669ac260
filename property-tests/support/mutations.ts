import fc from 'fast-check';

/** Mutations of a valid encoding, for decoder fuzzing: flipped bytes, truncation, extension. */
export function mutated(valid: fc.Arbitrary<Uint8Array>): fc.Arbitrary<Buffer> {
  return fc
    .tuple(
      valid,
      fc.array(fc.tuple(fc.nat(), fc.integer({ min: 0, max: 255 })), { maxLength: 4 }),
      fc.option(fc.nat(), { nil: undefined }),
      fc.uint8Array({ maxLength: 6 }),
    )
    .map(([bytes, flips, cut, tail]) => {
      const out = Buffer.from(bytes);
      for (const [at, value] of flips) if (out.length > 0) out[at % out.length] = value;
      const kept = cut === undefined ? out : out.subarray(0, cut % (out.length + 1));
      return Buffer.concat([kept, tail]);
    });
}
