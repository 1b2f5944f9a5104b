/**
 * Pass-through throughput with the stock `redis-benchmark`: GET, SET and INCR
 * from 50 clients, at pipeline 1 (latency-bound: one request per round trip)
 * and pipeline 16 (throughput-bound: the proxy's per-byte cost shows).
 *
 * It is a child process anyway; we only read its CSV ("test","rps",...).
 * Against nutcracker it prints "WARNING: Could not fetch server CONFIG" on
 * stderr (twemproxy does not forward CONFIG) and carries on; that is expected.
 *
 * With `cluster`, `--cluster`: it reads CLUSTER NODES from the seed (`port`),
 * spreads its clients over the masters and tags each master's keys so they
 * hash to its slots; it prints the masters before the CSV.
 */
import { spawnTracked } from './processes.js';

export const TESTS = ['GET', 'SET', 'INCR'] as const;
export type TestName = (typeof TESTS)[number];

/** Requests per second for each test. */
export type BenchmarkResult = Record<TestName, number>;

export interface BenchmarkOptions {
  port: number;
  requests: number;
  pipeline: number;
  clients: number;
  /** Redis Cluster mode, `port` being the seed. */
  cluster?: boolean;
}

export async function runRedisBenchmark(bin: string, options: BenchmarkOptions): Promise<BenchmarkResult> {
  const args = ['-h', '127.0.0.1', '-p', String(options.port), '-t', 'get,set,incr'];
  args.push('-c', String(options.clients), '-n', String(options.requests), '-q', '--csv');
  if (options.pipeline > 1) args.push('-P', String(options.pipeline));
  if (options.cluster) args.push('--cluster');
  const child = spawnTracked('redis-benchmark', bin, args, options.port);
  const status = await child.exited;
  if (status !== 0) throw new Error(`redis-benchmark ${args.join(' ')} failed (${status}):\n${child.output()}`);
  return parseCsv(child.stdout(), args);
}

/** `"test","rps",...` then one line per test; anything else means the run went wrong. */
export function parseCsv(csv: string, args: string[]): BenchmarkResult {
  const rps = new Map<string, number>();
  for (const line of csv.split('\n')) {
    const fields = line.trim().replace(/^"|"$/g, '').split('","');
    if (fields.length < 2 || fields[0] === 'test' || fields[0] === '') continue;
    rps.set(fields[0], Number(fields[1]));
  }
  const result = {} as BenchmarkResult;
  for (const test of TESTS) {
    const value = rps.get(test);
    if (value === undefined || !(value > 0)) {
      throw new Error(`redis-benchmark ${args.join(' ')}: no ${test} figure in its output:\n${csv}`);
    }
    result[test] = value;
  }
  return result;
}
