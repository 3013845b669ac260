/**
 * The percentile-distribution pictures of bench:latency (docs/latency.svg, docs/latency-e2e.svg): latency (ms, log scale)
 * against percentile on the usual HdrHistogram axis, log of 1 / (1 − p), so that p50, p90, p99,
 * p99.9 … are evenly spaced and the tail is as wide as the body. Hand-written SVG: no plotting
 * dependency for one chart.
 */

export interface Series {
  readonly name: string;
  /** Points in increasing percentile; `percentile` in [0, 100], `ms` > 0. */
  readonly percentiles: ReadonlyArray<{ readonly percentile: number; readonly ms: number }>;
  /** A baseline (the raw client): drawn thicker. @defaultValue false */
  readonly baseline?: boolean;
  /** Drawn dashed (a second load in one picture). @defaultValue false */
  readonly dashed?: boolean;
  /** The colour's index (the same case at two loads: one colour). @defaultValue the series' index */
  readonly colour?: number;
}

const WIDTH = 860;
const HEIGHT = 480;
const MARGIN = { left: 70, right: 190, top: 40, bottom: 50 };
const MAX_NINES = 5;
const COLOURS = ['#000000', '#1f77b4', '#ff7f0e', '#2ca02c', '#d62728', '#9467bd', '#8c564b', '#e377c2'];

/** Where percentile p lies on the x axis, in "nines": 0 at p0, 1 at p90, 2 at p99, … */
function nines(percentile: number): number {
  if (percentile >= 100) return MAX_NINES;
  return Math.min(MAX_NINES, -Math.log10(1 - percentile / 100));
}

const escape = (s: string): string => s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');

export function renderPercentileSvg(title: string, series: readonly Series[]): string {
  if (series.length === 0) throw new RangeError('renderPercentileSvg: no series');
  const all = series.flatMap((s) => s.percentiles.map((p) => Math.max(p.ms, 0.001)));
  const lo = 10 ** Math.floor(Math.log10(Math.min(...all)));
  const hi = 10 ** Math.ceil(Math.log10(Math.max(...all)));
  const plotW = WIDTH - MARGIN.left - MARGIN.right;
  const plotH = HEIGHT - MARGIN.top - MARGIN.bottom;
  const x = (percentile: number): number => MARGIN.left + (nines(percentile) / MAX_NINES) * plotW;
  const y = (ms: number): number =>
    MARGIN.top +
    plotH -
    ((Math.log10(Math.max(ms, lo)) - Math.log10(lo)) / (Math.log10(hi) - Math.log10(lo))) * plotH;
  const out: string[] = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${WIDTH}" height="${HEIGHT}" viewBox="0 0 ${WIDTH} ${HEIGHT}" font-family="sans-serif" font-size="12">`,
    `<rect width="${WIDTH}" height="${HEIGHT}" fill="#ffffff"/>`,
    `<text x="${MARGIN.left}" y="22" font-size="13">${escape(title)}</text>`,
  ];
  const ticks = ['0', '90', '99', '99.9', '99.99', '99.999'];
  ticks.forEach((label, i) => {
    const px = MARGIN.left + (i / MAX_NINES) * plotW;
    out.push(`<line x1="${px}" y1="${MARGIN.top}" x2="${px}" y2="${MARGIN.top + plotH}" stroke="#dddddd"/>`);
    out.push(`<text x="${px}" y="${MARGIN.top + plotH + 18}" text-anchor="middle">p${label}</text>`);
  });
  for (let v = lo; v <= hi * 1.0001; v *= 10) {
    const py = y(v);
    out.push(
      `<line x1="${MARGIN.left}" y1="${py}" x2="${MARGIN.left + plotW}" y2="${py}" stroke="#dddddd"/>`,
    );
    out.push(
      `<text x="${MARGIN.left - 6}" y="${py + 4}" text-anchor="end">${v >= 1 ? v : v.toPrecision(1)} ms</text>`,
    );
  }
  out.push(
    `<text x="${MARGIN.left + plotW / 2}" y="${HEIGHT - 10}" text-anchor="middle">percentile (log of 1 / (1 − p))</text>`,
  );
  series.forEach((s, i) => {
    const colour = COLOURS[(s.colour ?? i) % COLOURS.length]!;
    const points = s.percentiles.map((p) => `${x(p.percentile).toFixed(1)},${y(p.ms).toFixed(1)}`).join(' ');
    const dash = s.dashed === true ? ' stroke-dasharray="6 4"' : '';
    out.push(
      `<polyline fill="none" stroke="${colour}" stroke-width="${s.baseline === true ? 3 : 1.6}"${dash} points="${points}"/>`,
    );
    const ly = MARGIN.top + 14 + i * 18;
    const lx = MARGIN.left + plotW + 16;
    out.push(
      `<line x1="${lx}" y1="${ly - 4}" x2="${lx + 22}" y2="${ly - 4}" stroke="${colour}" stroke-width="3"${dash}/>`,
    );
    out.push(`<text x="${lx + 28}" y="${ly}">${escape(s.name)}</text>`);
  });
  out.push('</svg>');
  return `${out.join('\n')}\n`;
}
