// @ts-check
/**
 * The command-line face of streamtx.js that tests/contract/test_node_client.py drives. Prints JSON lines;
 * BigInts travel as {"bigint": "<digits>"} both ways, bytes as {"type": "Buffer", "data": [...]}.
 *
 *   node driver.js TARGET deploy                  < script.sql
 *   node driver.js TARGET query SQL [PARAMS]      (PARAMS: a JSON object)
 *   node driver.js TARGET call PROCEDURE [PARAMS]
 *   node driver.js TARGET push PRODUCER WINDOW [pack] < JSON lines {"stream", "rows", "batch_id"?}
 *   node driver.js TARGET subscribe STREAM FROM_TS COUNT   (prints COUNT lines {"ts", "rows"}, then exits)
 *
 * `push` prints one line per batch as its ack arrives ({"i": line index, ...ack}), then
 * {"done": true, "calls": PushStream calls opened, "coalesced": acks that covered several batches}.
 * A failure prints {"error": {code, codeName, message}} and exits with status 2. The token, if
 * any, comes from STREAMTX_TOKEN.
 */
'use strict';

const readline = require('node:readline');
const { Client } = require('../streamtx');

/** @param {string} _key @param {any} value */
const replacer = (_key, value) => (typeof value === 'bigint' ? { bigint: value.toString() } : value);
/** @param {string} _key @param {any} value */
const reviver = (_key, value) =>
  value && typeof value === 'object' && Object.keys(value).join() === 'bigint' ? BigInt(value.bigint) : value;
/** @param {any} obj */
const print = (obj) => process.stdout.write(`${JSON.stringify(obj, replacer)}\n`);

async function readStdin() {
  const chunks = [];
  for await (const chunk of process.stdin) chunks.push(chunk);
  return Buffer.concat(chunks).toString('utf8');
}

/** @param {import('../streamtx').Client} client @param {string} producerId @param {number} window @param {boolean} pack */
async function push(client, producerId, window, pack) {
  const producer = client.producer({ producerId, window, pack });
  let calls = 0;
  let coalesced = 0;
  const { open, onAck } = producer;
  producer.open = () => {
    calls++;
    return open.call(producer);
  };
  producer.onAck = (/** @type {any} */ ack) => {
    if (Number(ack.count) > 1) coalesced++;
    onAck.call(producer, ack);
  };
  const acks = [];
  let i = 0;
  for await (const line of readline.createInterface({ input: process.stdin })) {
    if (!line.trim()) continue;
    const { stream, rows, batch_id: batchId } = JSON.parse(line, reviver);
    await producer.ready();
    const index = i++;
    const printed = producer.push(stream, rows, { batchId }).then((ack) => print({ i: index, ...ack }));
    printed.catch(() => {}); // a failure is reported once, by Promise.all below
    acks.push(printed);
  }
  await Promise.all(acks);
  await producer.close();
  print({ done: true, calls, coalesced });
}

async function main() {
  const [target, verb, arg, extra, flag] = process.argv.slice(2);
  const client = new Client(target, { retries: 20, token: process.env.STREAMTX_TOKEN });
  try {
    if (verb === 'deploy') print(await client.deploy(await readStdin()));
    else if (verb === 'query') print(await client.query(arg, JSON.parse(extra ?? '{}', reviver)));
    else if (verb === 'call') print(await client.call(arg, JSON.parse(extra ?? '{}', reviver)));
    else if (verb === 'push') await push(client, arg, Number(extra), flag === 'pack');
    else if (verb === 'subscribe') {
      let left = Number(flag);
      for await (const batch of client.subscribe(arg, { fromTs: BigInt(extra) })) {
        print(batch);
        if (--left === 0) break;
      }
    } else throw new Error(`unknown verb ${verb}: deploy | query | call | push | subscribe`);
  } catch (/** @type {any} */ err) {
    print({ error: { code: err.code, codeName: err.codeName, message: err.message } });
    process.exitCode = 2;
  } finally {
    client.close();
  }
}

main();
