// protocol/vectors/calls.json: whole client-stream call sequences (spec 4.3)
// played against the Node server on raw sockets, frame by frame.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import path from 'node:path';
import { createServer, type Server } from '../src/index.js';
import { encodeHello, decodeHello, decodeFrame, HELLO_SIZE, HEADER_SIZE, type Frame } from '../src/frame.js';
import { readJSON, tmpDir, within } from './helpers.js';
import { sum, hold } from './bidi-fixtures.js';
import { raw } from '../src/index.js';

interface Step {
  from: 'client' | 'server';
  type: number; type_name: string; flags: number; id: number; aux: number;
  head_hex: string; payload_hex: string; hex: string;
  head_any?: boolean; code_name?: string;
}
interface CallVector { name: string; steps: Step[]; connection_error?: boolean }

const dir = tmpDir();
const sock = path.join(dir, 'vec.sock');
let srv: Server;
before(async () => {
  srv = createServer({ handlers: { sum, hold, echo: raw((b) => b) } });
  await srv.listen(sock);
});
after(() => srv.close());

/** A raw connection: hello exchange, then frames one at a time, and whether the server closed. */
async function open(): Promise<{ s: net.Socket; helloFlags: number; next: () => Promise<Frame | null> }> {
  const s = net.connect(sock);
  await new Promise((r) => s.once('connect', r));
  let buf = Buffer.alloc(0);
  let ended = false;
  let wake: (() => void) | null = null;
  s.on('data', (d) => { buf = Buffer.concat([buf, d]); wake?.(); });
  s.on('end', () => { ended = true; wake?.(); });
  s.write(encodeHello({ version: 1, flags: 3, maxFrame: 1 << 20, maxInFlight: 0 }));
  const need = async (n: number): Promise<boolean> => {
    while (buf.length < n && !ended) await new Promise<void>((r) => { wake = r; });
    wake = null;
    return buf.length >= n;
  };
  assert.ok(await need(HELLO_SIZE));
  const h = decodeHello(buf.subarray(0, HELLO_SIZE));
  buf = buf.subarray(HELLO_SIZE);
  return {
    s,
    helloFlags: h.flags,
    next: async () => {
      if (!(await need(HEADER_SIZE))) return null;
      const total = HEADER_SIZE + buf.readUInt16LE(2) + buf.readUInt32LE(8);
      if (!(await need(total))) return null;
      const f = decodeFrame(buf.subarray(0, total), 1 << 20);
      buf = buf.subarray(total);
      return f;
    },
  };
}

test('calls.json: every sequence, frame by frame, against the Node server', async () => {
  const v = readJSON<{ methods: Record<string, string>; calls: CallVector[] }>('protocol/vectors/calls.json');
  assert.ok(v.calls.length >= 10);
  for (const m of Object.keys(v.methods)) assert.ok(['sum', 'echo', 'hold'].includes(m), `calls.json names a method ${m} this test does not serve`);
  for (const call of v.calls) {
    const c = await open();
    assert.equal(c.helloFlags & 2, 2, 'the server hello sets client_stream');
    const canceled = new Set<number>();
    try {
      for (const [i, st] of call.steps.entries()) {
        const where = `${call.name}, step ${i} (${st.type_name})`;
        if (st.from === 'client') {
          c.s.write(Buffer.from(st.hex, 'hex'));
          if (st.type_name === 'cancel') canceled.add(st.id);
          continue;
        }
        let f: Frame | null;
        for (;;) {
          f = await within(5000, c.next(), where);
          assert.ok(f !== null, `${where}: the server closed the connection`);
          if (f.typeName === 'ping') continue; // not part of a call
          if (canceled.has(f.id)) continue; // a frame of a canceled call MAY come
          if (call.connection_error === true && i === call.steps.length - 1 && f.id !== 0) continue; // call frames before the connection error
          break;
        }
        assert.equal(f.type, st.type, `${where}: type ${f.typeName}`);
        assert.equal(f.flags, st.flags, where);
        assert.equal(f.id, st.id, where);
        assert.equal(f.aux, st.aux, where);
        if (st.code_name !== undefined) assert.equal(f.codeName, st.code_name, where);
        if (st.head_any !== true) assert.equal(f.head.toString('hex'), st.head_hex, where);
        assert.equal(f.payload.toString('hex'), st.payload_hex, where);
      }
      if (call.connection_error === true) {
        assert.equal(await within(5000, c.next(), `${call.name}: end of stream`), null, `${call.name}: the server closes after a connection error`);
      }
    } finally {
      c.s.destroy();
    }
  }
});
