/** What {@link measureUtf8} found. */
export interface Utf8Measure {
  /** The UTF-8 length in bytes, a lone surrogate counted as the 3 bytes of U+FFFD (as `Buffer.byteLength` does). */
  readonly bytes: number;
  /** Whether the text holds a lone UTF-16 surrogate. */
  readonly loneSurrogate: boolean;
}

/**
 * Measures a string as LevelDB and the broker will store it, in one pass: its UTF-8 length, and
 * whether it holds a lone UTF-16 surrogate. UTF-8 encoding turns every lone surrogate into U+FFFD,
 * so two names or keys that differ only there would become one on disk and at the broker: every
 * name or key that becomes a LevelDB key or a broker name must refuse them.
 *
 * @internal Shared by the producer-name and domain-key checks.
 * @example
 * ```ts
 * measureUtf8('é🚀'); // { bytes: 6, loneSurrogate: false }
 * measureUtf8('a\uD800'); // { bytes: 4, loneSurrogate: true }
 * ```
 */
export function measureUtf8(text: string): Utf8Measure {
  let bytes = 0;
  let loneSurrogate = false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c < 0x80) bytes += 1;
    else if (c < 0x800) bytes += 2;
    else if (c < 0xd800 || c > 0xdfff) bytes += 3;
    else {
      const next = text.charCodeAt(i + 1); // NaN past the end
      if (c <= 0xdbff && next >= 0xdc00 && next <= 0xdfff) {
        bytes += 4;
        i++;
      } else {
        bytes += 3; // as U+FFFD
        loneSurrogate = true;
      }
    }
  }
  return { bytes, loneSurrogate };
}
