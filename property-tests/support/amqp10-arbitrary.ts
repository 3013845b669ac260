import fc from 'fast-check';
import { gzipSync } from 'node:zlib';

// A structure-aware model of AMQP 1.0 values, messages and OSIRIS chunks for the decoders'
// properties (issue 32): every type of AMQP 1.0 part 1 in its 8- and 32-bit forms, lists, maps,
// arrays of any element type (arrays of arrays, of maps, of described constructors, of zero-width
// elements in any number), described values; messages of any sections, descriptors valid or not
// (Object.prototype names among them); chunks of plain entries and sub-entry batches (none, gzip,
// gzip bombs). The encoder records where every length and count field lies, so that a mutation
// can change exactly those (see {@link mutatedFields}), and the model knows what the decoder must
// do with its well-formed encodings (see {@link Encoded.valid}).

/** The type of a value, or of an array's elements (they share one constructor). */
export type AmqpType =
  | { readonly t: 'fixed'; readonly code: number; readonly width: number }
  | { readonly t: 'var'; readonly code: number }
  | { readonly t: 'list'; readonly wide: boolean }
  | { readonly t: 'map'; readonly wide: boolean }
  | { readonly t: 'array'; readonly wide: boolean; readonly of: AmqpType }
  | { readonly t: 'described'; readonly descriptor: AmqpNode; readonly of: AmqpType };

/** A value of the model. */
export type AmqpNode =
  | { readonly k: 'fixed'; readonly code: number; readonly bytes: Uint8Array }
  | { readonly k: 'var'; readonly code: number; readonly bytes: Uint8Array }
  | { readonly k: 'list'; readonly wide: boolean; readonly items: readonly AmqpNode[] }
  | { readonly k: 'map'; readonly wide: boolean; readonly items: readonly AmqpNode[] }
  | {
      readonly k: 'array';
      readonly wide: boolean;
      readonly of: AmqpType;
      /** Elements of a zero-width type: only their number. */
      readonly count: number;
      readonly items: readonly AmqpNode[];
    }
  | { readonly k: 'described'; readonly descriptor: AmqpNode; readonly value: AmqpNode };

/** Fixed-width type codes and their widths (AMQP 1.0 part 1); width 0: no bytes after the code. */
export const FIXED: ReadonlyArray<readonly [number, number]> = [
  [0x40, 0],
  [0x41, 0],
  [0x42, 0],
  [0x43, 0],
  [0x44, 0],
  [0x45, 0],
  [0x56, 1],
  [0x50, 1],
  [0x51, 1],
  [0x52, 1],
  [0x53, 1],
  [0x54, 1],
  [0x55, 1],
  [0x60, 2],
  [0x61, 2],
  [0x70, 4],
  [0x71, 4],
  [0x72, 4],
  [0x73, 4],
  [0x74, 4],
  [0x80, 8],
  [0x81, 8],
  [0x82, 8],
  [0x83, 8],
  [0x84, 8],
  [0x94, 16],
  [0x98, 16],
];

/** Variable-width codes: binary, string, symbol, in their 8-bit (0xa_) and 32-bit (0xb_) forms. */
const VAR_CODES = [0xa0, 0xa1, 0xa3, 0xb0, 0xb1, 0xb3] as const;

/** A zero-width element type (null, true, false, uint0, ulong0, list0). */
export function isZeroWidth(type: AmqpType): boolean {
  return type.t === 'fixed' && type.width === 0;
}

/** An element count of a zero-width array: mostly small, sometimes the 8-bit and 16-bit edges or far beyond. */
const zeroWidthCount = fc.oneof(
  { weight: 6, arbitrary: fc.nat(40) },
  { weight: 2, arbitrary: fc.constantFrom(254, 255, 256, 65_535, 65_536) },
  { weight: 1, arbitrary: fc.integer({ min: 0, max: 200_000 }) },
);

/** Bytes of a fixed-width value; chars stay below the surrogates (their decoding is the identity's). */
function fixedBytes(code: number, width: number): fc.Arbitrary<Uint8Array> {
  if (code === 0x73) {
    return fc.integer({ min: 0, max: 0xd7ff }).map((p) => Uint8Array.of(0, 0, p >> 8, p & 0xff));
  }
  return fc.uint8Array({ minLength: width, maxLength: width });
}

/** Bytes of a variable-width value: valid UTF-8 for strings and symbols (lossy decoding is the identity's). */
function varBytes(code: number): fc.Arbitrary<Uint8Array> {
  const binary = code === 0xa0 || code === 0xb0;
  const text = (minLength: number, maxLength: number): fc.Arbitrary<Uint8Array> =>
    fc.string({ minLength, maxLength }).map((s) => Uint8Array.from(Buffer.from(s)));
  const small = binary ? fc.uint8Array({ maxLength: 12 }) : text(0, 12);
  // Now and then over 255 bytes: the 8-bit form must then give way to the 32-bit one.
  const long = binary ? fc.uint8Array({ minLength: 256, maxLength: 300 }) : text(256, 300);
  return fc.oneof({ weight: 9, arbitrary: small }, { weight: 1, arbitrary: long });
}

/** A descriptor: a smallulong, a ulong or a symbol. */
const descriptor: fc.Arbitrary<AmqpNode> = fc.oneof(
  fc.nat(255).map((n): AmqpNode => ({ k: 'fixed', code: 0x53, bytes: Uint8Array.of(n) })),
  fc.uint8Array({ minLength: 8, maxLength: 8 }).map((b): AmqpNode => ({ k: 'fixed', code: 0x80, bytes: b })),
  fc
    .constantFrom('x', 'com.example:t', 'amqp:value:*')
    .map((s): AmqpNode => ({ k: 'var', code: 0xa3, bytes: Uint8Array.from(Buffer.from(s)) })),
);

/** An element type, nested up to `depth` arrays. */
function amqpType(depth: number): fc.Arbitrary<AmqpType> {
  const leaves: Array<fc.Arbitrary<AmqpType>> = [
    fc.constantFrom(...FIXED).map(([code, width]): AmqpType => ({ t: 'fixed', code, width })),
    fc.constantFrom(...VAR_CODES).map((code): AmqpType => ({ t: 'var', code })),
    fc.boolean().map((wide): AmqpType => ({ t: 'list', wide })),
    fc.boolean().map((wide): AmqpType => ({ t: 'map', wide })),
  ];
  if (depth <= 0) return fc.oneof(...leaves);
  return fc.oneof(
    ...leaves,
    fc.tuple(fc.boolean(), amqpType(depth - 1)).map(([wide, of]): AmqpType => ({ t: 'array', wide, of })),
    fc
      .tuple(descriptor, fc.oneof(...leaves.slice(0, 2)))
      .map(([d, of]): AmqpType => ({ t: 'described', descriptor: d, of })),
  );
}

/** A value of type `type` (an array's element), its compounds holding any values down to `depth`. */
function valueOf(type: AmqpType, depth: number): fc.Arbitrary<AmqpNode> {
  switch (type.t) {
    case 'fixed':
      return fixedBytes(type.code, type.width).map((bytes): AmqpNode => ({
        k: 'fixed',
        code: type.code,
        bytes,
      }));
    case 'var':
      return varBytes(type.code).map((bytes): AmqpNode => ({ k: 'var', code: type.code, bytes }));
    case 'list':
      return fc
        .array(anyValue(depth - 1), { maxLength: depth > 0 ? 4 : 0 })
        .map((items): AmqpNode => ({ k: 'list', wide: type.wide, items }));
    case 'map':
      return fc
        .array(fc.tuple(anyValue(depth - 1), anyValue(depth - 1)), { maxLength: depth > 0 ? 3 : 0 })
        .map((pairs): AmqpNode => ({ k: 'map', wide: type.wide, items: pairs.flat() }));
    case 'array':
      return arrayOf(type.wide, type.of, depth - 1);
    case 'described':
      return valueOf(type.of, depth).map((value): AmqpNode => ({
        k: 'described',
        descriptor: type.descriptor,
        value,
      }));
  }
}

function arrayOf(wide: boolean, of: AmqpType, depth: number): fc.Arbitrary<AmqpNode> {
  const inner = of.t === 'described' ? of.of : of;
  if (isZeroWidth(inner)) {
    return zeroWidthCount.map((count): AmqpNode => ({ k: 'array', wide, of, count, items: [] }));
  }
  return fc
    .array(valueOf(of, Math.max(0, depth)), { maxLength: 4 })
    .map((items): AmqpNode => ({ k: 'array', wide, of, count: items.length, items }));
}

const memo = new Map<number, fc.Arbitrary<AmqpNode>>();

/** Any value, compounds nested up to `depth` levels. */
export function anyValue(depth: number): fc.Arbitrary<AmqpNode> {
  const known = memo.get(depth);
  if (known !== undefined) return known;
  const d = Math.max(0, depth);
  const value = amqpType(d).chain((type) => valueOf(type, d));
  const made =
    d === 0
      ? value
      : fc.oneof(
          { weight: 4, arbitrary: value },
          {
            weight: 1,
            arbitrary: fc
              .tuple(descriptor, anyValue(d - 1))
              .map(([des, v]): AmqpNode => ({ k: 'described', descriptor: des, value: v })),
          },
        );
  memo.set(depth, made);
  return made;
}

/** Where a length or count field lies in an encoding, and its width in bytes. */
export interface Field {
  readonly at: number;
  readonly width: 1 | 4;
}

/** An encoding, the fields a mutation may change, and what the model knows of it. */
export interface Encoded {
  readonly bytes: Buffer;
  readonly fields: readonly Field[];
  /** Elements of zero-width arrays, all arrays together. */
  readonly zeroWidth: number;
}

/** Builds encodings and remembers their length and count fields. */
class Writer {
  readonly parts: Buffer[] = [];
  readonly fields: Field[] = [];
  length = 0;
  zeroWidth = 0;

  push(b: Uint8Array): void {
    const buf = Buffer.from(b);
    this.parts.push(buf);
    this.length += buf.length;
  }

  /** A 1- or 4-byte size or count field. */
  field(value: number, wide: boolean): void {
    const b = Buffer.alloc(wide ? 4 : 1);
    if (wide) b.writeUInt32BE(value, 0);
    else b[0] = value;
    this.fields.push({ at: this.length, width: wide ? 4 : 1 });
    this.push(b);
  }

  /** Appends another writer's output (its fields shifted). */
  append(w: Writer): void {
    for (const f of w.fields) this.fields.push({ at: f.at + this.length, width: f.width });
    for (const p of w.parts) this.push(p);
    this.zeroWidth += w.zeroWidth;
  }

  done(): Encoded {
    return { bytes: Buffer.concat(this.parts), fields: this.fields, zeroWidth: this.zeroWidth };
  }
}

/** The constructor bytes of an element type, with the width `wide` for compounds and variable types. */
function constructorOf(type: AmqpType, wide: boolean, w: Writer): void {
  switch (type.t) {
    case 'fixed':
      w.push(Uint8Array.of(type.code));
      return;
    case 'var':
      w.push(Uint8Array.of(wide ? type.code | 0x10 : type.code & ~0x10));
      return;
    case 'list':
      w.push(Uint8Array.of(wide ? 0xd0 : 0xc0));
      return;
    case 'map':
      w.push(Uint8Array.of(wide ? 0xd1 : 0xc1));
      return;
    case 'array':
      w.push(Uint8Array.of(wide ? 0xf0 : 0xe0));
      return;
    case 'described':
      w.push(Uint8Array.of(0x00));
      w.append(encodeWriter(type.descriptor));
      constructorOf(type.of, wide, w);
  }
}

/** Whether a node's body needs the 32-bit form (it asked for it, or does not fit 8 bits). */
function needsWide(node: AmqpNode): boolean {
  switch (node.k) {
    case 'fixed':
      return false;
    case 'var':
      return node.code >= 0xb0 || node.bytes.length > 255;
    case 'described':
      return needsWide(node.value);
    default: {
      // The 32-bit body: size and count of 4 bytes each; the 8-bit size counts its count byte.
      const inner = bodyWriter(node, true).length - 8;
      return node.wide || inner + 1 > 255 || countOf(node) > 255;
    }
  }
}

/** The count of a compound node. */
function countOf(node: AmqpNode): number {
  return node.k === 'array' ? node.count : node.k === 'list' || node.k === 'map' ? node.items.length : 0;
}

/** A node's body (what follows its constructor), in the 8- or 32-bit form. */
function bodyWriter(node: AmqpNode, wide: boolean): Writer {
  const w = new Writer();
  switch (node.k) {
    case 'fixed':
      w.push(node.bytes);
      return w;
    case 'var':
      w.field(node.bytes.length, wide);
      w.push(node.bytes);
      return w;
    case 'described':
      return bodyWriter(node.value, wide);
    case 'list':
    case 'map':
    case 'array': {
      const inner = new Writer();
      if (node.k === 'array') {
        const elementsWide = node.items.some(needsWide) || elementTypeWide(node.of);
        constructorOf(node.of, elementsWide, inner);
        const of = node.of.t === 'described' ? node.of.of : node.of;
        if (isZeroWidth(of)) inner.zeroWidth += node.count;
        for (const item of node.items) inner.append(bodyWriter(item, elementsWide));
      } else {
        for (const item of node.items) inner.append(encodeWriter(item));
      }
      const width = wide ? 4 : 1;
      w.field(inner.length + width, wide);
      w.field(countOf(node), wide);
      w.append(inner);
      return w;
    }
  }
}

/** Whether an element type asked for its 32-bit form. */
function elementTypeWide(type: AmqpType): boolean {
  switch (type.t) {
    case 'var':
      return type.code >= 0xb0;
    case 'list':
    case 'map':
    case 'array':
      return type.wide;
    case 'described':
      return elementTypeWide(type.of);
    default:
      return false;
  }
}

function encodeWriter(node: AmqpNode): Writer {
  const w = new Writer();
  if (node.k === 'described') {
    w.push(Uint8Array.of(0x00));
    w.append(encodeWriter(node.descriptor));
    w.append(encodeWriter(node.value));
    return w;
  }
  const wide = needsWide(node);
  const code =
    node.k === 'fixed' || node.k === 'var'
      ? node.k === 'var'
        ? wide
          ? node.code | 0x10
          : node.code & ~0x10
        : node.code
      : { list: 0xc0, map: 0xc1, array: 0xe0 }[node.k] | (wide ? 0x10 : 0);
  w.push(Uint8Array.of(code));
  w.append(bodyWriter(node, wide));
  return w;
}

/** A value's encoding (constructor and body), with its fields. */
export function encodeValue(node: AmqpNode): Encoded {
  return encodeWriter(node).done();
}

/** The nine sections of AMQP 1.0 part 3 §3.2: code, symbolic name, and the value kind they hold. */
export const SECTIONS: ReadonlyArray<readonly [number, string, 'list' | 'map' | 'binary' | 'any']> = [
  [0x70, 'amqp:header:list', 'list'],
  [0x71, 'amqp:delivery-annotations:map', 'map'],
  [0x72, 'amqp:message-annotations:map', 'map'],
  [0x73, 'amqp:properties:list', 'list'],
  [0x74, 'amqp:application-properties:map', 'map'],
  [0x75, 'amqp:data:binary', 'binary'],
  [0x76, 'amqp:amqp-sequence:list', 'list'],
  [0x77, 'amqp:value:*', 'any'],
  [0x78, 'amqp:footer:map', 'map'],
];

/** Names that are no sections, among them members of Object.prototype (issue 32 item 5). */
export const NOT_SECTION_NAMES = [
  'constructor',
  'toString',
  '__proto__',
  'valueOf',
  'hasOwnProperty',
  'amqp:value',
  '',
] as const;

/** One section of a message as the model builds it. */
export interface SectionNode {
  /** How the descriptor is written; `name` for a symbol. */
  readonly descriptor:
    | { readonly form: 'smallulong' | 'ulong'; readonly code: number }
    | { readonly form: 'sym8' | 'sym32'; readonly name: string };
  /** Absent only after a descriptor that is no section: a bare descriptor is how one hides. */
  readonly value: AmqpNode | undefined;
}

/** Whether the model recognises a section descriptor, and its code. */
export function sectionCode(section: SectionNode): number | undefined {
  const d = section.descriptor;
  if ('code' in d) return d.code >= 0x70 && d.code <= 0x78 ? d.code : undefined;
  const named = d.name;
  return SECTIONS.find(([, name]) => name === named)?.[0];
}

const BODY_KIND: Readonly<Record<number, number>> = { 0x75: 0x75, 0x76: 0x76, 0x77: 0x77 };

/** A message: sections in any order, of valid or invalid descriptors, with values of the right kind. */
export const messageNode: fc.Arbitrary<readonly SectionNode[]> = fc.array(
  fc
    .tuple(
      fc.constantFrom(...SECTIONS),
      fc.oneof(
        { weight: 8, arbitrary: fc.constantFrom('smallulong', 'ulong', 'sym8', 'sym32') },
        { weight: 2, arbitrary: fc.constantFrom('invalid-name', 'invalid-code') },
      ),
      fc.constantFrom(...NOT_SECTION_NAMES),
      fc.integer({ min: 0, max: 255 }).filter((n) => n < 0x70 || n > 0x78),
      fc.boolean(),
    )
    .chain(([[code, name, kind], form, badName, badCode, bare]) => {
      const value =
        kind === 'list'
          ? fc.boolean().chain((wide) => valueOf({ t: 'list', wide }, 2))
          : kind === 'map'
            ? fc.boolean().chain((wide) => valueOf({ t: 'map', wide }, 2))
            : kind === 'binary'
              ? fc.constantFrom(0xa0, 0xb0).chain((c) => valueOf({ t: 'var', code: c }, 0))
              : anyValue(3);
      const d: SectionNode['descriptor'] =
        form === 'invalid-name'
          ? { form: 'sym8', name: badName }
          : form === 'invalid-code'
            ? { form: 'smallulong', code: badCode }
            : form === 'sym8' || form === 'sym32'
              ? { form, name }
              : { form, code };
      const invalid = form === 'invalid-name' || form === 'invalid-code';
      return value.map((v): SectionNode => ({ descriptor: d, value: invalid && bare ? undefined : v }));
    }),
  { maxLength: 4 },
);

/** A message's encoding; `valid`: what the model says the decoder must do with it. */
export interface EncodedMessage extends Encoded {
  /** The decoder must read it (otherwise refuse it with a ChunkDecodeError). */
  readonly valid: boolean;
}

/** Encodes a message; `valid` when every descriptor is a section, bodies do not mix, and its zero-width elements are within the allowance. */
export function encodeMessage(sections: readonly SectionNode[]): EncodedMessage {
  const w = new Writer();
  let known = true;
  let body = 0;
  for (const s of sections) {
    w.push(Uint8Array.of(0x00));
    const d = s.descriptor;
    if ('code' in d) {
      w.push(
        d.form === 'smallulong'
          ? Uint8Array.of(0x53, d.code)
          : Uint8Array.of(0x80, 0, 0, 0, 0, 0, 0, 0, d.code),
      );
    } else {
      const name = Buffer.from(d.name);
      w.push(Uint8Array.of(d.form === 'sym8' ? 0xa3 : 0xb3));
      w.field(name.length, d.form === 'sym32');
      w.push(name);
    }
    if (s.value !== undefined) w.append(encodeWriter(s.value));
    const code = sectionCode(s);
    if (code === undefined) known = false;
    const kind = code === undefined ? undefined : BODY_KIND[code];
    if (kind !== undefined) {
      // data and amqp-sequence may repeat; amqp-value only once; the three do not mix.
      if (body !== 0 && (body !== kind || kind === 0x77)) known = false;
      body = kind;
    }
  }
  const out = w.done();
  return { ...out, valid: known && out.zeroWidth <= out.bytes.length };
}

/**
 * Mutations that keep the structure's shape but lie in its fields: each chosen length or count
 * field is set to 0, its value ± 1, the largest of its width, or any value; then bytes flipped.
 */
export function mutatedFields(encoded: fc.Arbitrary<Encoded>): fc.Arbitrary<Buffer> {
  return encoded.chain(({ bytes, fields }) =>
    fc
      .tuple(
        fc.array(
          fc.tuple(
            fc.nat(),
            fc.oneof(
              fc.constantFrom('zero', 'plus', 'minus', 'max'),
              fc.nat().map((n) => n),
            ),
          ),
          { minLength: fields.length === 0 ? 0 : 1, maxLength: 3 },
        ),
        fc.array(fc.tuple(fc.nat(), fc.integer({ min: 0, max: 255 })), { maxLength: 2 }),
      )
      .map(([changes, flips]) => {
        const out = Buffer.from(bytes);
        for (const [i, how] of changes) {
          if (fields.length === 0) break;
          const f = fields[i % fields.length]!;
          const max = f.width === 1 ? 0xff : 0xffff_ffff;
          const old = f.width === 1 ? out[f.at]! : out.readUInt32BE(f.at);
          const value =
            how === 'zero'
              ? 0
              : how === 'plus'
                ? Math.min(max, old + 1)
                : how === 'minus'
                  ? Math.max(0, old - 1)
                  : how === 'max'
                    ? max
                    : how % (max + 1);
          if (f.width === 1) out[f.at] = value;
          else out.writeUInt32BE(value, f.at);
        }
        for (const [at, value] of flips) if (out.length > 0) out[at % out.length] = value;
        return out;
      }),
  );
}

/** One entry of a chunk: a plain record, or a batch (codec 0 none, 1 gzip) of records. */
export interface EntryNode {
  readonly records: readonly Buffer[];
  readonly codec: 0 | 1 | undefined;
}

/**
 * A gzip bomb batch: `records` messages of one data section of `size` zero bytes, announced as
 * what they are (gzip shrinks them about 1 000 times).
 */
export function bombEntry(size: number, records = 1): Buffer {
  const head5 = Buffer.from([0x00, 0x53, 0x75, 0xb0, 0, 0, 0, 0]);
  head5.writeUInt32BE(size, 4);
  const length = head5.length + size;
  const raw = Buffer.alloc((4 + length) * records);
  for (let i = 0; i < records; i++) {
    raw.writeUInt32BE(length, i * (4 + length));
    head5.copy(raw, i * (4 + length) + 4);
  }
  const data = gzipSync(raw);
  const head = Buffer.alloc(11);
  head[0] = 0x90;
  head.writeUInt16BE(records, 1);
  head.writeUInt32BE(raw.length, 3);
  head.writeUInt32BE(data.length, 7);
  return Buffer.concat([head, data]);
}
