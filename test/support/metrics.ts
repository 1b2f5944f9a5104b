/** Reading a Prometheus text exposition in tests. */

/** The value of one series (name and labels exactly as exposed) in a metrics text, or undefined. */
export function sample(text: string, series: string): number | undefined {
  const line = text.split('\n').find((l) => l.startsWith(`${series} `));
  return line === undefined ? undefined : Number(line.slice(series.length + 1));
}
