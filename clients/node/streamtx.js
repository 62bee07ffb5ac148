// @ts-check
/**
 * A Node.js client for the streamtx wire protocol (protos/streamtx/v1/streamtx.proto,
 * contract in docs/protocol.md): deploy, query, call, and pipelined exactly-once pushes.
 *
 * No Arrow library: pushes send protobuf `Rows`, results come back as `format: ROWS`.
 * int64 travels as text on the JS side of protobufjs (`longs: String`) and is handed to
 * the caller as BigInt, so ids, timestamps and integer values are exact beyond 2^53.
 */
'use strict';

const path = require('node:path');
const { randomUUID } = require('node:crypto');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const DEFAULT_TARGET = '127.0.0.1:7411';
const DEFAULT_PROTO = path.join(__dirname, '..', '..', 'protos', 'streamtx', 'v1', 'streamtx.proto');
const MAX_MESSAGE_BYTES = 64 * 1024 * 1024;
/** Values (rows x columns) packed into one PushStream message at most; a larger batch travels alone. */
const PACK_MAX_VALUES = 65536;
const BACKOFF_BASE_MS = 100;
const BACKOFF_MAX_MS = 5000;
const CODE_NAMES = Object.fromEntries(Object.entries(grpc.status).map(([name, code]) => [code, name]));

/**
 * @typedef {'COMMITTED' | 'REJECTED' | 'DUPLICATE'} Outcome
 * @typedef {{
 *   stream: string, producerId: string, batchId: bigint, outcome: Outcome, timestamp: bigint,
 *   code: number, codeName: string, reason: string, original: 'COMMITTED' | 'REJECTED' | null, rows: number
 * }} Ack  One batch's outcome; `code`/`reason` describe a rejection (for DUPLICATE: the original's).
 * @typedef {Record<string, any>} Row  A row as a plain object: column name -> value.
 */

/** A failed call: `code` is the gRPC status number, `codeName` its name, `message` the server's details. */
class StreamTxError extends Error {
  /** @param {number} code @param {string} message */
  constructor(code, message) {
    super(message);
    this.name = 'StreamTxError';
    this.code = code;
    this.codeName = CODE_NAMES[code] || 'UNKNOWN';
  }
}

/** @param {any} err a grpc-js ServiceError or status */
function toError(err) {
  return new StreamTxError(err.code ?? grpc.status.UNKNOWN, err.details || err.message || 'unknown error');
}

/**
 * A protobuf Value for a JS value. Safe integers and BigInts are int_value (the server converts
 * them exactly or rejects), other numbers double_value; text, booleans, bytes and arrays map to
 * their kinds, null/undefined to SQL NULL.
 * @param {any} v @param {string} where what to name in an error
 * @returns {object}
 */
function toValue(v, where) {
  if (v === null || v === undefined) return {};
  if (typeof v === 'bigint') return { int_value: v.toString() };
  if (typeof v === 'number') return Number.isSafeInteger(v) ? { int_value: String(v) } : { double_value: v };
  if (typeof v === 'string') return { string_value: v };
  if (typeof v === 'boolean') return { bool_value: v };
  if (v instanceof Uint8Array) return { bytes_value: Buffer.from(v) };
  if (Array.isArray(v)) return { list_value: { values: v.map((x) => toValue(x, where)) } };
  throw new TypeError(`${where}: cannot send a ${v?.constructor?.name ?? typeof v} (${String(v)}); ` +
    'use a number, BigInt, string, boolean, Buffer, array or null (timestamps and decimals as text)');
}

/** @param {any} v a decoded protobuf Value @returns {any} */
function fromValue(v) {
  switch (v.kind) {
    case 'int_value': return BigInt(v.int_value);
    case 'double_value': return v.double_value;
    case 'string_value': return v.string_value;
    case 'bool_value': return v.bool_value;
    case 'bytes_value': return Buffer.from(v.bytes_value);
    case 'list_value': return v.list_value.values.map(fromValue);
    default: return null;
  }
}

/**
 * Rows (an array of objects) as protobuf `Rows`: the columns are the keys in order of first
 * appearance; a row without one of them sends NULL for it.
 * @param {Row[]} rows @returns {{columns: string[], rows: {values: object[]}[]}}
 */
function encodeRows(rows) {
  if (!Array.isArray(rows)) throw new TypeError('rows must be an array of objects (column name -> value)');
  rows.forEach((r, i) => {
    if (r === null || typeof r !== 'object' || Array.isArray(r)) throw new TypeError(`row ${i} is not an object`);
  });
  const columns = [...new Set(rows.flatMap((r) => Object.keys(r)))];
  return {
    columns,
    rows: rows.map((r, i) => ({ values: columns.map((c) => toValue(r[c], `row ${i} column '${c}'`)) })),
  };
}

/** @param {any} data a decoded RowData in ROWS format @returns {Row[]} */
function decodeRows(data) {
  if (data?.format === 'arrow_ipc') {
    throw new StreamTxError(grpc.status.UNIMPLEMENTED, 'the server answered in Arrow, not ROWS: it predates format ROWS');
  }
  const { columns, rows } = data?.rows ?? { columns: [], rows: [] };
  return rows.map((/** @type {any} */ r) =>
    Object.fromEntries(columns.map((/** @type {string} */ c, /** @type {number} */ i) => [c, fromValue(r.values[i])])));
}

/** @param {Record<string, any>} params */
function encodeParams(params) {
  return Object.fromEntries(Object.entries(params).map(([k, v]) => [k, toValue(v, `parameter '${k}'`)]));
}

/** @param {number} attempt */
const backoff = (attempt) => Math.min(BACKOFF_MAX_MS, BACKOFF_BASE_MS * 2 ** attempt);
/** @param {number} ms */
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

class Client {
  /**
   * @param {string} [target] HOST:PORT of the server, or several comma-separated (the hosts of a
   *   cluster): a call that finds its host unreachable moves to the next
   * @param {{token?: string, protoPath?: string, retries?: number, deadlineMs?: number}} [options]
   *   token: sent as `authorization: Bearer <token>`; retries: reconnection attempts in a row
   *   before a push or query fails (UNAVAILABLE); deadlineMs: per unary call.
   */
  constructor(target = DEFAULT_TARGET, options = {}) {
    const definition = protoLoader.loadSync(options.protoPath ?? DEFAULT_PROTO, {
      keepCase: true, longs: String, enums: String, defaults: true, oneofs: true,
    });
    this.api = /** @type {any} */ (grpc.loadPackageDefinition(definition)).streamtx.v1;
    this.targets = target.split(',').map((t) => t.trim()).filter((t) => t);
    if (!this.targets.length) throw new RangeError(`target ${JSON.stringify(target)}: no HOST:PORT given`);
    this.target = this.targets[0];
    this.retries = options.retries ?? 10;
    this.deadlineMs = options.deadlineMs;
    this.token = options.token;
    /** @type {any} */
    this.stub = this.connect(this.target);
  }

  /** @param {string} target @returns {any} */
  connect(target) {
    return new this.api.StreamTx(target, grpc.credentials.createInsecure(), {
      'grpc.max_send_message_length': MAX_MESSAGE_BYTES,
      'grpc.max_receive_message_length': MAX_MESSAGE_BYTES,
      'grpc.initial_reconnect_backoff_ms': 100,
      'grpc.max_reconnect_backoff_ms': 2000,
    });
  }

  /**
   * After a broken connection: the next of several targets (the hosts of a cluster), on a new stub;
   * one target is kept. True when every target has had its turn since the first (so a retry counts,
   * and waits its backoff): a dead host among live ones costs a switch, not the retries.
   * @returns {boolean}
   */
  failOver() {
    if (this.targets.length < 2) return true;
    const at = (this.targets.indexOf(this.target) + 1) % this.targets.length;
    const old = this.stub;
    this.target = this.targets[at];
    this.stub = this.connect(this.target);
    old.close();
    return at === 0;
  }

  /** @returns {grpc.Metadata} */
  metadata() {
    const md = new grpc.Metadata();
    if (this.token) md.set('authorization', `Bearer ${this.token}`);
    return md;
  }

  /**
   * One unary call; retried on UNAVAILABLE only when `retry` (read-only calls: a Deploy or Call
   * may have committed before the connection broke, so they are never sent twice).
   * @param {string} method @param {object} request @param {boolean} retry @returns {Promise<any>}
   */
  async unary(method, request, retry) {
    for (let attempt = 0; ; attempt++) {
      try {
        return await new Promise((resolve, reject) => {
          const options = this.deadlineMs ? { deadline: Date.now() + this.deadlineMs } : {};
          this.stub[method](request, this.metadata(), options, (/** @type {any} */ err, /** @type {any} */ res) =>
            err ? reject(err) : resolve(res));
        });
      } catch (err) {
        if (!(retry && /** @type {any} */ (err).code === grpc.status.UNAVAILABLE && attempt < this.retries)) {
          throw toError(err);
        }
        if (!this.failOver()) {
          attempt--; // another host: not a retry
          continue;
        }
        await sleep(backoff(attempt));
      }
    }
  }

  /**
   * Applies a deploy script atomically (every statement or none).
   * @param {string} sql @returns {Promise<{created: {kind: string, name: string}[], dropped: {kind: string, name: string}[]}>}
   */
  async deploy(sql) {
    const res = await this.unary('Deploy', { sql }, false);
    return { created: res.created, dropped: res.dropped };
  }

  /**
   * Read-only SQL over the committed state; `params` are bound as `$name`.
   * @param {string} sql @param {Record<string, any>} [params] @returns {Promise<Row[]>}
   */
  async query(sql, params = {}) {
    const res = await this.unary('Query', { sql, params: encodeParams(params), format: 'ROWS' }, true);
    return decodeRows(res.result);
  }

  /**
   * Runs an OLTP procedure; one array of rows per result-producing statement.
   * @param {string} procedure @param {Record<string, any>} [params] @returns {Promise<Row[][]>}
   */
  async call(procedure, params = {}) {
    const res = await this.unary('Call', { procedure, params: encodeParams(params), format: 'ROWS' }, false);
    return res.results.map(decodeRows);
  }

  /**
   * The committed batches of a stream no procedure consumes, in timestamp order, following it live:
   * yields `{ts, rows}` (`ts`: a BigInt, the timestamp of the command whose TEs emitted the rows).
   * `fromTs` 0 starts at the oldest the server keeps; a broken connection (UNAVAILABLE) resumes
   * after the last `ts` yielded, up to `retries` times in a row. Leaving the loop cancels the call.
   * @param {string} stream @param {{fromTs?: bigint | number}} [options]
   * @returns {AsyncGenerator<{ts: bigint, rows: Row[]}>}
   */
  async *subscribe(stream, options = {}) {
    let next = BigInt(options.fromTs ?? 0);
    for (let attempt = 0; ; attempt++) {
      const call = this.stub.Subscribe({ stream, from_ts: next.toString(), format: 'ROWS' }, this.metadata());
      try {
        for await (const batch of call) {
          attempt = 0;
          const ts = BigInt(batch.ts);
          next = ts + 1n;
          yield { ts, rows: decodeRows(batch.data) };
        }
        return;
      } catch (err) {
        if (/** @type {any} */ (err).code !== grpc.status.UNAVAILABLE || attempt >= this.retries) throw toError(err);
        if (this.failOver()) await sleep(backoff(attempt));
        else attempt--; // another host: not a retry
      } finally {
        call.cancel();
      }
    }
  }

  /**
   * A producer of pipelined, exactly-once pushes (see Producer).
   * @param {ConstructorParameters<typeof Producer>[1]} [options] @returns {Producer}
   */
  producer(options = {}) {
    return new Producer(this, options);
  }

  close() {
    this.stub.close();
  }
}

/**
 * @typedef {{
 *   seq: number, stream: string, batchId: bigint, columns: string[], rows: {values: object[]}[],
 *   resolve: (ack: Ack) => void, reject: (err: Error) => void, promise: Promise<Ack>
 * }} Entry  One batch pushed and not yet acknowledged: what to (re-)send and whom to tell.
 */

/**
 * Pushes batches over one bidirectional PushStream. Batch ids are consecutive per stream from
 * `firstBatchId`; at most `window` batches are unacknowledged on the wire, the rest wait here.
 * Every batch is kept until its ack: when the stream breaks (UNAVAILABLE, a server restart),
 * it reconnects with backoff and sends every unacknowledged batch again with the same id, which
 * the server's deduplication makes safe: each batch is applied exactly once.
 */
class Producer {
  /**
   * @param {Client} client
   * @param {{producerId?: string, firstBatchId?: number | bigint, window?: number, pack?: boolean}} [options]
   *   producerId: give the same one after a restart to continue (and deduplicate) its batches;
   *   pack: send batches that wait together (same stream and columns, consecutive ids) in one
   *   message (`batch_rows`), saving per-message costs for many small batches.
   */
  constructor(client, options = {}) {
    this.client = client;
    this.producerId = options.producerId ?? randomUUID();
    this.firstBatchId = BigInt(options.firstBatchId ?? 1);
    this.window = options.window ?? 256;
    if (this.window < 1) throw new RangeError('window must be >= 1');
    this.pack = options.pack ?? true;
    /** @type {Map<string, bigint>} */
    this.next = new Map();
    /** @type {Entry[]} batches not sent on the current call, in push order */
    this.queue = [];
    /** @type {Map<number, Entry>} batches sent on the current call and not acknowledged, in send order */
    this.sent = new Map();
    /** @type {Map<string, Entry[]>} */
    this.byKey = new Map();
    /** @type {any} */
    this.call = null;
    this.seq = 0;
    this.failures = 0;
    this.scheduled = false;
    this.reconnecting = false;
    this.closed = false;
    /** @type {(() => void)[]} */
    this.readyWaiters = [];
  }

  /** Batches pushed and not yet acknowledged (sent or waiting for room in the window). */
  get pending() {
    return this.queue.length + this.sent.size;
  }

  /**
   * Pushes one atomic batch; resolves with its ack. Rejects only when the batch cannot be sent
   * (bad values; the server refused the stream; `retries` reconnections in a row failed).
   * @param {string} stream @param {Row[]} rows
   * @param {{batchId?: number | bigint}} [options] an explicit id (e.g. to re-send an old batch);
   *   later batches then follow the highest id used
   * @returns {Promise<Ack>}
   */
  push(stream, rows, options = {}) {
    if (this.closed) return Promise.reject(new StreamTxError(grpc.status.FAILED_PRECONDITION, 'producer is closed'));
    let encoded;
    try {
      encoded = encodeRows(rows);
    } catch (err) {
      return Promise.reject(err);
    }
    const next = this.next.get(stream) ?? this.firstBatchId;
    const batchId = options.batchId === undefined ? next : BigInt(options.batchId);
    this.next.set(stream, batchId + 1n > next ? batchId + 1n : next);
    /** @type {any} */
    const entry = { seq: this.seq++, stream, batchId, ...encoded };
    entry.promise = new Promise((resolve, reject) => Object.assign(entry, { resolve, reject }));
    entry.promise.catch(() => {}); // a push nobody awaits must not crash the process: flush() reports it
    const key = `${stream}\0${batchId}`;
    this.byKey.set(key, [...(this.byKey.get(key) ?? []), entry]);
    this.queue.push(entry);
    this.schedule();
    return entry.promise;
  }

  /** Resolves once fewer than `window` batches are pending: await it before each push to bound memory. */
  ready() {
    if (this.pending < this.window) return Promise.resolve();
    return new Promise((resolve) => this.readyWaiters.push(() => resolve(undefined)));
  }

  /** Waits for every batch pushed so far; resolves with their acks in push order, or rejects with the first failure. */
  flush() {
    return Promise.all([...this.sent.values(), ...this.queue].map((e) => e.promise));
  }

  /** Flushes, then ends the PushStream call. */
  async close() {
    try {
      await this.flush();
    } finally {
      this.closed = true;
      this.call?.end();
      this.call = null;
    }
  }

  /** Sends on the next tick, so batches pushed in one go leave together (in one message with `pack`). */
  schedule() {
    if (!this.scheduled) {
      this.scheduled = true;
      setImmediate(() => {
        this.scheduled = false;
        this.pump();
      });
    }
  }

  pump() {
    if (this.reconnecting || !this.queue.length || this.sent.size >= this.window) return;
    const call = this.call ?? this.open();
    const batch = this.queue.splice(0, this.window - this.sent.size);
    for (const e of batch) this.sent.set(e.seq, e);
    let run = [batch[0]];
    let values = batch[0].rows.length * batch[0].columns.length;
    for (const e of batch.slice(1)) {
      const last = run[run.length - 1];
      values += e.rows.length * e.columns.length;
      if (this.pack && e.stream === last.stream && e.batchId === last.batchId + 1n &&
          e.columns.join('\0') === last.columns.join('\0') && values <= PACK_MAX_VALUES) {
        run.push(e);
      } else {
        call.write(this.message(run));
        run = [e];
        values = e.rows.length * e.columns.length;
      }
    }
    call.write(this.message(run));
  }

  /**
   * One PushRequest for batches of one stream with consecutive ids (`batch_rows`: each one's rows).
   * @param {Entry[]} run
   */
  message(run) {
    const first = run[0];
    return {
      stream: first.stream,
      producer_id: this.producerId,
      batch_id: first.batchId.toString(),
      data: { rows: { columns: first.columns, rows: run.flatMap((e) => e.rows) } },
      batch_rows: run.length > 1 ? run.map((e) => String(e.rows.length)) : [],
    };
  }

  open() {
    const call = this.client.stub.PushStream(this.client.metadata());
    this.call = call;
    /** @type {any} */
    let status = null;
    let ended = false;
    const closed = () => status && ended && this.onClosed(call, status);
    call.on('data', (/** @type {any} */ ack) => this.call === call && this.onAck(ack));
    call.on('error', () => {}); // the 'status' event carries it
    call.on('status', (/** @type {any} */ s) => { status = s; closed(); });
    call.on('end', () => { ended = true; closed(); }); // after every ack was delivered
    return call;
  }

  /** @param {any} ack a decoded PushAck, possibly for `count` consecutive batches */
  onAck(ack) {
    this.failures = 0;
    const count = Math.max(Number(ack.count), 1);
    for (let i = 0; i < count; i++) {
      const batchId = BigInt(ack.batch_id) + BigInt(i);
      const key = `${ack.stream}\0${batchId}`;
      const waiting = this.byKey.get(key);
      const entry = waiting?.shift();
      if (!entry) continue; // not ours
      if (!waiting?.length) this.byKey.delete(key);
      this.sent.delete(entry.seq);
      const timestamp = BigInt(ack.timestamp);
      entry.resolve({
        stream: ack.stream,
        producerId: ack.producer_id,
        batchId,
        outcome: ack.outcome === 'OUTCOME_UNSPECIFIED' ? 'REJECTED' : ack.outcome,
        timestamp: timestamp > 0n ? timestamp + BigInt(i) : 0n,
        code: ack.code,
        codeName: CODE_NAMES[ack.code] || 'UNKNOWN',
        reason: ack.reason,
        original: ack.original === 'OUTCOME_UNSPECIFIED' ? null : ack.original,
        rows: entry.rows.length,
      });
    }
    this.settled();
    this.schedule();
  }

  /**
   * The call ended. Batches it did not acknowledge go back to the front of the queue; after a
   * broken connection (UNAVAILABLE, or an end with acks owed) they are sent again on a new call.
   * @param {any} call @param {{code: number, details: string}} status
   */
  onClosed(call, status) {
    if (this.call !== call) return;
    this.call = null;
    if (!this.sent.size) {
      this.schedule();
      return;
    }
    this.queue = [...this.sent.values(), ...this.queue];
    this.sent.clear();
    const broken = status.code === grpc.status.UNAVAILABLE || status.code === grpc.status.OK;
    if (broken && this.failures < this.client.retries && !this.closed) {
      this.reconnecting = true;
      const wait = this.client.failOver() ? backoff(this.failures++) : 0; // another host: no backoff, no retry spent
      setTimeout(() => {
        this.reconnecting = false;
        this.pump();
      }, wait);
      return;
    }
    const error = status.code === grpc.status.OK
      ? new StreamTxError(grpc.status.UNAVAILABLE, `push stream ended with ${this.queue.length} unacknowledged batch(es)`)
      : toError(status);
    for (const e of this.queue.splice(0)) e.reject(error);
    this.byKey.clear();
    this.failures = 0;
    this.settled();
  }

  settled() {
    while (this.readyWaiters.length && this.pending < this.window) this.readyWaiters.shift()?.();
  }
}

module.exports = { Client, Producer, StreamTxError, DEFAULT_TARGET };
