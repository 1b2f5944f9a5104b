/**
 * Minimal types for redis-parser 3 (the RESP2 parser node_redis used), which
 * ships none. Only what the reply-scanner oracle test needs.
 */
declare module 'redis-parser' {
  interface RedisParserOptions {
    returnReply(reply: unknown): void;
    returnError(error: Error): void;
    returnFatalError?(error: Error): void;
    returnBuffers?: boolean;
    stringNumbers?: boolean;
  }

  class RedisParser {
    constructor(options: RedisParserOptions);
    execute(buffer: Buffer): void;
    reset(): void;
  }

  export = RedisParser;
}
