#!/usr/bin/env node
// Nothing lost when the README was split into docs/guides/ (issue 38, item 2): every heading,
// every table row and every sentence of an earlier README must appear, word for word up to
// whitespace, in today's README.md or one of docs/guides/*.md. A sentence deliberately reworded
// or dropped is listed in docs/guides/.moved-exceptions.txt with the reason (one per line,
// "<first 60 characters of the old text> | <why>").
//
//   node scripts/check-docs-moved.mjs [<git ref of the old README> = 8874fef]
//
// Prints what is missing and exits 1 if anything is missing that no exception names.
import { execFileSync } from 'node:child_process';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { URL, fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('..', import.meta.url));
const ref = process.argv[2] ?? '8874fef';
const old = execFileSync('git', ['show', `${ref}:README.md`], { cwd: root, encoding: 'utf8' });
const guides = join(root, 'docs/guides');
const now = [readFileSync(join(root, 'README.md'), 'utf8')]
  .concat(
    readdirSync(guides)
      .filter((f) => f.endsWith('.md'))
      .map((f) => readFileSync(join(guides, f), 'utf8')),
  )
  .join('\n');

// Link targets are left out (a guide links `../../test/…` where the README linked `test/…`), and so
// is a paragraph's bold lead-in (`**Choosing a window.** `), which became the guide's heading.
const squash = (s) =>
  s
    .replace(/\]\([^)]*\)/g, ']')
    .replace(/\s+/g, ' ')
    .replace(/^\*\*[^*]+\.\*\* /, '')
    .trim();
const haystack = squash(now);
const exceptionsFile = join(guides, '.moved-exceptions.txt');
const exceptions = existsSync(exceptionsFile)
  ? readFileSync(exceptionsFile, 'utf8')
      .split('\n')
      .filter((l) => l.includes(' | '))
      .map((l) => squash(l.split(' | ')[0]))
  : [];

/** Headings, table rows, code lines, and the sentences of every paragraph or list item. */
function pieces(markdown) {
  const out = [];
  let para = [];
  let inCode = false;
  const endPara = () => {
    const text = squash(para.join(' '));
    para = [];
    if (text === '') return;
    // A sentence ends at ". ", "; " or ": " followed by a capital or a backtick, and at "— ".
    for (const s of text.split(/(?<=[.;:!?])\s+(?=[A-Z`*[(])/)) if (s.length > 0) out.push(s);
  };
  for (const line of markdown.split('\n')) {
    if (line.startsWith('```')) {
      endPara();
      inCode = !inCode;
      continue;
    }
    if (inCode) {
      if (line.trim() !== '') out.push(squash(line));
      continue;
    }
    if (/^#{1,6} /.test(line)) {
      endPara();
      out.push(squash(line.replace(/^#+ /, '')));
    } else if (line.startsWith('|')) {
      endPara();
      if (!/^\|[-| ]+\|$/.test(line)) out.push(squash(line));
    } else if (line.trim() === '' || /^\s*[-*] /.test(line)) {
      endPara();
      if (line.trim() !== '') para.push(line.replace(/^\s*[-*] /, ''));
    } else para.push(line);
  }
  endPara();
  return out;
}

let missing = 0;
let excused = 0;
const items = pieces(old);
for (const piece of items) {
  if (haystack.includes(piece)) continue;
  if (exceptions.some((e) => piece.startsWith(e))) {
    excused++;
    continue;
  }
  missing++;
  console.log(`missing: ${piece}`);
}
console.log(
  `check-docs-moved: ${items.length} pieces of ${ref}:README.md; ${missing} missing, ${excused} changed on purpose (docs/guides/.moved-exceptions.txt)`,
);
process.exit(missing > 0 ? 1 : 0);
