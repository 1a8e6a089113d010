// The README's example runs as pasted (importing 'udskit' by name), and the
// bench runs end to end (grpc-js against grpc-go included) in a short form.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile, spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { pkgDir, tmpDir, udskitBin, runGo, delay } from './helpers.js';

function run(file: string, args: string[], env: Record<string, string> = {}): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(process.execPath, [file, ...args], { cwd: pkgDir, env: { ...process.env, ...env }, timeout: 60_000 }, (err, stdout, stderr) => {
      resolve({ code: err ? (err as { code?: number }).code ?? 1 : 0, stdout, stderr });
    });
  });
}

test('README example runs as pasted', async () => {
  const md = fs.readFileSync(path.join(pkgDir, 'README.md'), 'utf8');
  const m = /```js\n([\s\S]*?)```/.exec(md);
  assert.ok(m, 'README has a ```js example');
  const code = m[1]!;
  assert.ok(code.trim().split('\n').length <= 12, 'the example is about 10 lines');
  // Inside the package directory 'udskit' resolves to this package (self-reference via "exports").
  const file = path.join(pkgDir, 'dist-test', 'readme-example.mjs');
  fs.writeFileSync(file, code);
  const r = await run(file, []);
  assert.equal(r.code, 0, r.stderr);
  assert.match(r.stdout, /greeting: 'hello world'/);
  assert.match(r.stdout, /\{ i: 2 \}/);
});

test('README server example runs as pasted and drains on SIGTERM', async () => {
  const md = fs.readFileSync(path.join(pkgDir, 'README.md'), 'utf8');
  const blocks = [...md.matchAll(/```js\n([\s\S]*?)```/g)].map((m) => m[1]!);
  assert.ok(blocks.length >= 2); // the others: readme-bidi.test.ts
  const file = path.join(pkgDir, 'dist-test', 'readme-server.mjs');
  fs.writeFileSync(file, blocks[1]!);
  const proc = spawn(process.execPath, [file], { cwd: pkgDir, stdio: ['ignore', 'pipe', 'pipe'] });
  let err = '';
  proc.stderr.on('data', (d) => { err += d; });
  const exited = new Promise<number | null>((r) => proc.on('exit', (code) => r(code)));
  try {
    let r = await runGo(['call', '--wait', '--timeout', '10s', '/tmp/udskit-readme.sock', 'getService', '{"service":"barista"}']);
    assert.equal(r.code, 0, r.stderr + err);
    assert.deepEqual(JSON.parse(r.stdout), { host: '1.2.3.4', port: 8765 });
    r = await runGo(['call', '/tmp/udskit-readme.sock', 'getService', '{"service":"x"}']);
    assert.match(r.stderr, /not_found \(5\): no service x/);
    assert.equal(fs.statSync('/tmp/udskit-readme.sock').mode & 0o777, 0o660);
  } finally {
    proc.kill('SIGTERM');
  }
  assert.equal(await exited, 0, err);
  await delay(10);
  assert.equal(fs.existsSync('/tmp/udskit-readme.sock'), false);
});

test('bench runs all three clients and writes its JSON', async () => {
  const out = path.join(tmpDir(), 'bench.json');
  const r = await run(path.join(pkgDir, 'dist-test/bench/bench.js'), ['--json', out, '--rounds', '1', '--duration', '150', '--warmup', '50'], { UDSKIT_BIN: udskitBin });
  assert.equal(r.code, 0, r.stderr);
  const j = JSON.parse(fs.readFileSync(out, 'utf8'));
  assert.deepEqual(j.results.map((x: { client: string }) => x.client), ['udskit', 'ndjson', 'grpc-js', 'udskit', 'ndjson', 'grpc-js']);
  for (const x of j.results) {
    assert.ok(x.rps > 0 && x.p50_us > 0 && x.p99_us >= x.p50_us, JSON.stringify(x));
  }
});
