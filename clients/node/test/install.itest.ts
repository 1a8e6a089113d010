// (npm run test:install; make node-test runs it after npm test: npm and tsc
// runs need more than npm test's per-file timeout on a loaded machine.)
// The package installed as a user installs it, from this repository (it is not on
// npm yet): `npm pack` + `npm install <tarball>`, and `npm install <path>` (a
// symlink; npm runs "prepare", which builds dist/) from a fresh copy without
// node_modules. Then an ESM import, a CommonJS require, and a strict TypeScript
// project with skipLibCheck: false, each against the installed package; and the
// README's one-liner against the Go demo server exits by itself.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { pkgDir, tmpDir, startGo } from './helpers.js';

interface Run { code: number | null; stdout: string; stderr: string }

function sh(cmd: string, args: string[], cwd: string, timeout = 180_000): Promise<Run> {
  return new Promise((resolve) => {
    execFile(cmd, args, { cwd, timeout, env: { ...process.env, npm_config_audit: 'false', npm_config_fund: 'false', npm_config_update_notifier: 'false' } },
      (err, stdout, stderr) => resolve({ code: err ? (typeof (err as { code?: unknown }).code === 'number' ? (err as { code: number }).code : 1) : 0, stdout, stderr }));
  });
}

/** The package's tracked source (what a clone has), copied to a new directory: no dist, no node_modules. */
function copySource(dst: string, withModules: boolean): string {
  fs.mkdirSync(dst, { recursive: true });
  for (const f of ['package.json', 'package-lock.json', 'README.md', 'tsconfig.json', 'tsconfig.cjs.json', 'tsconfig.test.json']) {
    fs.copyFileSync(path.join(pkgDir, f), path.join(dst, f));
  }
  for (const d of ['src', 'scripts']) fs.cpSync(path.join(pkgDir, d), path.join(dst, d), { recursive: true });
  if (withModules) fs.symlinkSync(path.join(pkgDir, 'node_modules'), path.join(dst, 'node_modules'));
  return dst;
}

function newApp(dir: string): string {
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, 'package.json'), JSON.stringify({ name: 'app', version: '1.0.0', private: true }));
  return dir;
}

const esm = `import { createServer, connect, UdskitError } from 'udskit';
const sock = process.argv[2];
const server = createServer({ handlers: { hello: ({ name }) => ({ greeting: 'hello ' + name }) } });
await server.listen(sock);
const c = await connect(sock);
console.log(JSON.stringify(await c.call('hello', { name: 'esm' })));
try { await c.call('nope', {}); } catch (e) { console.log(e instanceof UdskitError, e.code); }
await c.close(); await server.shutdown({ timeout: 1000 });
`;
const cjs = `const { createServer, connect, UdskitError } = require('udskit');
(async () => {
  const sock = process.argv[2];
  const server = createServer({ handlers: { hello: ({ name }) => ({ greeting: 'hello ' + name }) } });
  await server.listen(sock);
  const c = await connect(sock);
  console.log(JSON.stringify(await c.call('hello', { name: 'cjs' })));
  try { await c.call('nope', {}); } catch (e) { console.log(e instanceof UdskitError, e.code); }
  await c.close(); await server.shutdown({ timeout: 1000 });
})();
`;

async function checkRuns(app: string): Promise<void> {
  const d = tmpDir();
  fs.writeFileSync(path.join(app, 'a.mjs'), esm);
  fs.writeFileSync(path.join(app, 'b.cjs'), cjs);
  let r = await sh(process.execPath, ['a.mjs', path.join(d, 'e.sock')], app, 20_000);
  assert.equal(r.code, 0, r.stderr);
  assert.equal(r.stdout, '{"greeting":"hello esm"}\ntrue unimplemented\n');
  r = await sh(process.execPath, ['b.cjs', path.join(d, 'c.sock')], app, 20_000);
  assert.equal(r.code, 0, r.stderr);
  assert.equal(r.stdout, '{"greeting":"hello cjs"}\ntrue unimplemented\n');
}

test('npm pack + npm install <tarball>: ships dist (ESM, CommonJS, types)', { timeout: 300_000 }, async () => {
  const d = tmpDir();
  const src = copySource(path.join(d, 'udskit'), true);
  let r = await sh('npm', ['pack', '--pack-destination', d], src);
  assert.equal(r.code, 0, r.stderr);
  const tgz = path.join(d, 'udskit-' + (JSON.parse(fs.readFileSync(path.join(pkgDir, 'package.json'), 'utf8')) as { version: string }).version + '.tgz');
  const app = newApp(path.join(d, 'app'));
  r = await sh('npm', ['install', tgz], app);
  assert.equal(r.code, 0, r.stderr);
  for (const f of ['dist/index.js', 'dist/index.d.ts', 'dist/cjs/index.js', 'dist/cjs/index.d.ts', 'dist/cjs/package.json', 'README.md']) {
    assert.ok(fs.existsSync(path.join(app, 'node_modules/udskit', f)), `the tarball has ${f}`);
  }
  assert.ok(!fs.existsSync(path.join(app, 'node_modules/udskit/src')), 'the tarball has no sources');
  await checkRuns(app);

  // A fresh TypeScript project: strict, skipLibCheck false, both module kinds.
  fs.writeFileSync(path.join(app, 'tsconfig.json'), JSON.stringify({
    compilerOptions: {
      strict: true, skipLibCheck: false, noEmit: true, target: 'ES2022', module: 'NodeNext', moduleResolution: 'NodeNext',
      types: ['node'], typeRoots: [path.join(pkgDir, 'node_modules/@types')],
    },
    files: ['main.mts', 'main.cts'],
  }));
  fs.writeFileSync(path.join(app, 'main.mts'), `import { connect, createServer, UdskitError, bidi, clientStream, type CallOptions, type HandlerContext, type BidiOptions } from 'udskit';
const server = createServer({ handlers: { hi: (p: unknown, ctx: HandlerContext) => ({ p, m: ctx.method }),
  sum: bidi(async function* (ns) { let t = 0; for await (const n of ns) yield (t += n as number); }),
  count: clientStream(async (items) => { let n = 0; for await (const _ of items) n++; return n; }) } });
const c = await connect('/tmp/x.sock', { wait: true });
const opts: CallOptions = { timeout: 1000 };
const r: unknown = await c.call('hi', {}, opts);
const e = new UdskitError('not_found', 'x');
console.log(r, e.retryable, server);
const bo: BidiOptions = { timeoutMs: 1000 };
const b = c.bidiJSON<number, number>('sum', bo);
const sent: boolean = await b.write(1);
await b.end();
for await (const t of b) console.log(t + 1, sent);
const up = c.clientStream('count');
await up.write(Buffer.from('x'));
const resp: Buffer = await up.end();
console.log(resp.length);
`);
  fs.writeFileSync(path.join(app, 'main.cts'), `import udskit = require('udskit');
async function main(): Promise<void> {
  const c: udskit.Client = await udskit.connect('/tmp/x.sock');
  const e: udskit.UdskitError = new udskit.UdskitError('unavailable', 'x');
  console.log(e.code, await c.call('hi'));
  const b: udskit.BidiCall<number, number> = c.bidiJSON('sum');
  await b.write(2);
  console.log(await b.toArray());
}
void main();
`);
  r = await sh(process.execPath, [path.join(pkgDir, 'node_modules/typescript/bin/tsc'), '-p', '.'], app);
  assert.equal(r.code, 0, r.stdout + r.stderr);
});

test('npm install <path to a fresh clone of clients/node>: prepare builds dist', { timeout: 300_000 }, async () => {
  const d = tmpDir();
  const src = copySource(path.join(d, 'clone', 'clients', 'node'), false);
  const app = newApp(path.join(d, 'app'));
  const r = await sh('npm', ['install', '--prefer-offline', src], app);
  assert.equal(r.code, 0, r.stdout + r.stderr);
  assert.ok(fs.lstatSync(path.join(app, 'node_modules/udskit')).isSymbolicLink());
  await checkRuns(app);
});

test("the README's one-liner against the Go demo server exits by itself", async () => {
  const md = fs.readFileSync(path.join(pkgDir, 'README.md'), 'utf8');
  const m = /`bin\/udskit serve (\S+)`,\s+then `(await \(await connect\('\1'\)\)[^`]*)`/.exec(md);
  assert.ok(m, 'README shows the one-liner against bin/udskit serve');
  const sock = path.join(tmpDir(), 'demo.sock');
  const go = await startGo(sock);
  try {
    const file = path.join(pkgDir, 'dist-test', 'readme-oneliner.mjs');
    fs.writeFileSync(file, `import { connect } from 'udskit';\nconsole.log(${m[2]!.replaceAll(m[1]!, sock)});\n`);
    const t0 = Date.now();
    const r = await sh(process.execPath, [file], pkgDir, 15_000);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /hi: 1/);
    assert.ok(Date.now() - t0 < 5000, `the one-liner took ${Date.now() - t0}ms to exit`);
  } finally {
    await go.term();
  }
});
