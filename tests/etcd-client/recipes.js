// npm etcd3's client-side recipes — `client.lock(name)` and `client.election(name)` —
// unchanged against fenced's etcd API, driven by tests/etcd3_recipes.rs:
//
//   node recipes.js lock HOSTS WORKER LOGFILE
//     Until `stop` on stdin: try to take the lock `recipe` (etcd3's lock is a try-lock: a
//     create-only put of the key under a fresh lease; taken → held, else it fails at once),
//     and while holding it append `start WORKER CREATE_REVISION` to LOGFILE, sleep 150 ms,
//     append `end WORKER`, release (revoke the lease). A holder first checks that the key is
//     still under its lease (else the acquire is counted `lost` and it does not enter).
//     Prints `ready` once, then on stop one JSON line {"held", "busy", "errors", "lost"}.
//
//   node recipes.js elect HOSTS
//     Three candidates (alpha, beta, gamma; each its own client, so its own lease, TTL 15 s)
//     campaign
//     for the election `ring` in that order and an observer watches it. Prints `elected X`
//     when candidate X wins and `observed V` on every leader change the observer reports.
//     Commands on stdin: `resign X` (the campaign resigns), `revoke X` (the candidate's lease
//     is revoked, as when its owner dies), `proclaim X V`, `stop`.
//
// Unary calls carry a 3 s deadline (etcd3's documented `defaultCallOptions`): a call stuck on
// a node cut off by a partition fails and the pool tries another host.
'use strict';
const fs = require('fs');
const readline = require('readline');
const { Etcd3, EtcdLockFailedError } = require('etcd3');

const [mode, hostsArg] = process.argv.slice(2);
const hosts = hostsArg.split(',');
const newClient = () =>
  new Etcd3({
    hosts,
    dialTimeout: 2000,
    defaultCallOptions: (ctx) => (ctx.isStream ? {} : { deadline: Date.now() + 3000 }),
  });
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
let stopping = false;
const commands = [];
readline.createInterface({ input: process.stdin }).on('line', (l) => {
  if (l.trim() === 'stop') stopping = true;
  else commands.push(l.trim().split(' '));
});

// Release until it works (a revoke lost in a fault leaves the lease alive).
async function release(lock, counts) {
  for (let i = 0; i < 20; i++) {
    try {
      await lock.release();
      return;
    } catch (e) {
      counts.errors++;
      await sleep(200);
    }
  }
}

async function lockLoop(worker, logfile) {
  const client = newClient();
  const counts = { held: 0, busy: 0, errors: 0, lost: 0 };
  console.log('ready');
  const deadline = Date.now() + 120000;
  while (!stopping && Date.now() < deadline) {
    const lock = client.lock('recipe').ttl(5);
    const asked = Date.now();
    try {
      await lock.acquire();
    } catch (e) {
      if (e instanceof EtcdLockFailedError) {
        counts.busy++;
        await sleep(30);
      } else {
        // An unknown outcome (a deadline, a node gone): the key may have been created under
        // a lease etcd3 keeps alive in the background, so the lock would be held for good.
        // Revoke that lease, as an application must.
        counts.errors++;
        await release(lock, counts);
        await sleep(200);
      }
      continue;
    }
    try {
      // etcd3's lock does not check that its lease still lives: one granted long before the
      // put (calls retried through a fault) may lapse before the holder starts. Check the
      // key is still ours first (a fencing check), and report such a lost acquire.
      const kv = await client.get('recipe').exec();
      const lease = await lock.leaseId();
      if (!kv.kvs.length || kv.kvs[0].lease !== lease) {
        counts.lost++;
        console.error(`worker ${worker}: acquired after ${Date.now() - asked} ms, but key recipe is no longer its lease ${lease}'s: not entering`);
        continue;
      }
      const rev = kv.kvs[0].create_revision;
      fs.appendFileSync(logfile, `start ${worker} ${rev}\n`);
      await sleep(150);
      fs.appendFileSync(logfile, `end ${worker}\n`);
      counts.held++;
    } finally {
      await release(lock, counts);
    }
  }
  console.log(JSON.stringify(counts));
  client.close();
}

async function elect() {
  const names = ['alpha', 'beta', 'gamma'];
  const clients = {};
  const campaigns = {};
  const observerClient = newClient();
  const observer = await observerClient.election('ring', 15).observe();
  observer.on('change', (v) => console.log(`observed ${v}`));
  observer.on('error', (e) => console.error(`observer error: ${e}`));
  for (const n of names) {
    clients[n] = newClient();
    const c = clients[n].election('ring', 15).campaign(n);
    c.on('elected', () => console.log(`elected ${n}`));
    c.on('error', (e) => console.error(`campaign ${n} error: ${e}`));
    campaigns[n] = c;
    await sleep(300);
  }
  console.log('ready');
  const deadline = Date.now() + 120000;
  while (!stopping && Date.now() < deadline) {
    const cmd = commands.shift();
    if (!cmd) {
      await sleep(20);
      continue;
    }
    const [op, who, value] = cmd;
    for (let i = 0; ; i++) {
      try {
        if (op === 'resign') await campaigns[who].resign();
        else if (op === 'revoke') await campaigns[who].lease.revoke();
        else if (op === 'proclaim') await campaigns[who].proclaim(value);
        console.log(`done ${op} ${who}`);
        break;
      } catch (e) {
        if (i >= 20) throw new Error(`${op} ${who}: ${e}`);
        await sleep(200);
      }
    }
  }
  await observer.cancel();
  for (const c of Object.values(clients)) c.close();
  observerClient.close();
}

(mode === 'lock' ? lockLoop(process.argv[4], process.argv[5]) : elect())
  .then(() => process.exit(0))
  .catch((e) => {
    console.error(e);
    process.exit(1);
  });
