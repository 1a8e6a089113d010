// protocol/addresses.json, the remote forms: tls:host:port and ssh://[user@]host[:port]/path.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { parseAddr, splitSSH } from '../src/address.js';
import { readJSON } from './helpers.js';

test('addresses.json: every ssh vector splits into user, host, port and path', () => {
  const v = readJSON('protocol/addresses.json');
  let n = 0;
  for (const a of v.valid) {
    if (a.kind !== 'ssh') continue;
    n++;
    assert.deepEqual(splitSSH(parseAddr(a.input).name), a.ssh, a.input);
  }
  assert.ok(n >= 5, `only ${n} ssh vectors`);
});
