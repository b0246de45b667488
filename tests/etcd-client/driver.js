// An unchanged etcd client library (npm `etcd3`, microsoft/etcd3) against fenced's etcd API,
// driven by tests/etcd_client.rs:
//
//   node driver.js http://A:P,http://B:P,http://C:P
//
// 1. KV and Txn: put, get, prefix reads, delete, compare-and-swap both ways. Prints
//    `kv ok` (or throws).
// 2. A watch on the prefix `v/` from the revision of `v/0`, then key `v/<n>` created for
//    n = 1, 2, … every 20 ms, each by a create-only txn (`version == 0`), retried through any
//    member until it is known to exist — so a retry after a lost reply never writes twice.
//    Prints `watching` once the watch is open; the Rust test SIGKILLs members meanwhile. On
//    `stop` on stdin it stops writing, waits until the watch has seen the last key, and prints
//    one JSON line: {"written": N, "seen": [...], "reconnects": R}.
'use strict';
const { Etcd3 } = require('etcd3');
const readline = require('readline');

const hosts = process.argv[2].split(',');
const client = new Etcd3({ hosts, dialTimeout: 2000 });

function check(ok, what) {
  if (!ok) throw new Error(`check failed: ${what}`);
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Retry an operation through the pool until it succeeds (members are being killed).
async function retry(what, f) {
  const deadline = Date.now() + 60000;
  for (;;) {
    try {
      return await f();
    } catch (e) {
      if (Date.now() > deadline) throw new Error(`${what}: ${e}`);
      await sleep(100);
    }
  }
}

async function kv() {
  await retry('first put', () => client.put('kv/a').value('1'));
  await client.put('kv/b').value('2');
  check((await client.get('kv/a').string()) === '1', 'get kv/a');
  const all = await client.getAll().prefix('kv/').strings();
  check(JSON.stringify(all) === JSON.stringify({ 'kv/a': '1', 'kv/b': '2' }), `prefix ${JSON.stringify(all)}`);
  check((await client.getAll().prefix('kv/').count()) === 2, 'count');
  // Compare-and-swap: succeeds on the expected value, fails (and reads) on a stale one.
  const won = await client.if('kv/a', 'Value', '==', '1').then(client.put('kv/a').value('3')).commit();
  check(won.succeeded === true, 'CAS on the current value');
  const lost = await client
    .if('kv/a', 'Value', '==', '1')
    .then(client.put('kv/a').value('4'))
    .else(client.get('kv/a'))
    .commit();
  check(lost.succeeded === false, 'CAS on a stale value must fail');
  check(lost.responses[0].response_range.kvs[0].value.toString() === '3', 'the else branch reads');
  const deleted = await client.delete().key('kv/b');
  check(deleted.deleted === '1', `delete ${JSON.stringify(deleted)}`);
  check((await client.get('kv/b').string()) === null, 'deleted key is gone');
  console.log('kv ok');
}

async function watch() {
  const first = await retry('v/0', () => client.put('v/0').value('0'));
  const seen = [];
  let reconnects = 0;
  const watcher = await client.watch().prefix('v/').startRevision(first.header.revision).create();
  watcher.on('put', (kv) => seen.push(kv.value.toString()));
  watcher.on('disconnected', () => {
    reconnects += 1;
  });
  watcher.on('error', () => {});
  console.log('watching');

  let stop = false;
  readline.createInterface({ input: process.stdin }).on('line', (l) => {
    if (l.trim() === 'stop') stop = true;
  });
  let n = 0;
  while (!stop) {
    n += 1;
    const key = `v/${n}`;
    await retry(key, () => client.if(key, 'Version', '==', 0).then(client.put(key).value(String(n))).commit());
    await sleep(20);
  }
  const deadline = Date.now() + 30000;
  while (!seen.includes(String(n)) && Date.now() < deadline) {
    await sleep(50);
  }
  await watcher.cancel().catch(() => {});
  console.log(JSON.stringify({ written: n, seen, reconnects }));
}

(async () => {
  await kv();
  await watch();
  client.close();
  process.exit(0);
})().catch((e) => {
  console.error(e && e.stack ? e.stack : String(e));
  process.exit(1);
});
