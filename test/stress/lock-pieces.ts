/**
 * Where the integrity stress cuts a lock block it writes in pieces: the block's bytes (the four
 * RESP frames MULTI / INCRBY k 1 / EXPIRE k N / EXEC, exactly as an application sends them)
 * are mapped into the places a cut can fall, and each cut is drawn from one of them: inside a
 * frame's count line (`*3\r\n`), inside an argument's length line (`$6\r\n`), inside a command
 * name, inside the key, inside the ttl, between two frames, or at any byte at all.
 */
import type { Rng } from '../bench/random.js';

export const CUT_PLACES = ['count line', 'length line', 'command name', 'key', 'ttl', 'between frames', 'anywhere'] as const;
export type CutPlace = (typeof CUT_PLACES)[number];

/** A run of bytes of the block: [start, end). */
interface Span {
  readonly start: number;
  readonly end: number;
}

/** How often each place is drawn. */
const PLACE_WEIGHTS: ReadonlyArray<readonly [number, CutPlace]> = [
  [3, 'count line'],
  [2, 'length line'],
  [3, 'command name'],
  [3, 'key'],
  [3, 'ttl'],
  [2, 'between frames'],
  [3, 'anywhere'],
];

/** The block's bytes by place: for each, the spans a cut may fall strictly inside. */
export function blockPlaces(block: Buffer): Map<CutPlace, Span[]> {
  const places = new Map<CutPlace, Span[]>(CUT_PLACES.map((place) => [place, []]));
  const add = (place: CutPlace, start: number, end: number): void => void places.get(place)?.push({ start, end });
  let pos = 0;
  /** One `<prefix><n>\r\n` line at `pos`: its number, and `pos` moved past it. */
  const header = (prefix: number, place: CutPlace): number => {
    if (block[pos] !== prefix) throw new Error(`not a lock block: ${JSON.stringify(block.toString('latin1'))}`);
    const end = block.indexOf('\r\n', pos) + 2;
    add(place, pos, end);
    const n = Number(block.subarray(pos + 1, end - 2).toString('latin1'));
    pos = end;
    return n;
  };
  while (pos < block.length) {
    const args = header(0x2a /* * */, 'count line');
    let name = '';
    for (let i = 0; i < args; i++) {
      const length = header(0x24 /* $ */, 'length line');
      const value = block.subarray(pos, pos + length);
      if (i === 0) {
        name = value.toString('latin1').toUpperCase();
        add('command name', pos, pos + length);
      } else if (i === 1) add('key', pos, pos + length);
      else if (name === 'EXPIRE' || name === 'PEXPIRE') add('ttl', pos, pos + length);
      pos += length + 2;
    }
    if (pos < block.length) add('between frames', pos, pos); // a cut right at a frame's end
  }
  add('anywhere', 0, block.length);
  return places;
}

/**
 * Cuts `block` into 2 to 5 pieces: each cut drawn from a place (several may fall in one), the
 * cuts in order, none twice. Returns the pieces and the place of each cut.
 */
export function cutBlock(block: Buffer, rng: Rng): { pieces: Buffer[]; places: CutPlace[] } {
  const places = blockPlaces(block);
  const cuts = new Map<number, CutPlace>();
  const wanted = rng.int(1, 4);
  for (let attempt = 0; cuts.size < wanted && attempt < 20; attempt++) {
    const place = rng.weighted(PLACE_WEIGHTS);
    const spans = (places.get(place) ?? []).filter(
      (span) => span.end - span.start >= 2 || (span.start === span.end && place === 'between frames'),
    );
    if (spans.length === 0) continue;
    const span = rng.pick(spans);
    // Strictly inside the span (a cut at its edge is another place's), or at a frame boundary.
    const at = span.start === span.end ? span.start : rng.int(span.start + 1, span.end - 1);
    if (at <= 0 || at >= block.length || cuts.has(at)) continue;
    cuts.set(at, place);
  }
  const order = [...cuts.keys()].sort((a, b) => a - b);
  const pieces: Buffer[] = [];
  let from = 0;
  for (const at of order) {
    pieces.push(block.subarray(from, at));
    from = at;
  }
  pieces.push(block.subarray(from));
  return { pieces, places: order.map((at) => cuts.get(at) as CutPlace) };
}
