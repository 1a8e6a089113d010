// docs/observability.md's OpenTelemetry example (its ```mjs block) runs as pasted, with the
// real SDK (dev dependencies only): the interceptors are the hook, and a handler's own call is
// a child of its server span through the SDK's async-hooks context manager.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { pkgDir, repoDir, tmpDir } from './helpers.js';

test('the OpenTelemetry example of docs/observability.md makes one trace of five spans', async () => {
  const md = fs.readFileSync(path.join(repoDir, 'docs/observability.md'), 'utf8');
  const blocks = [...md.matchAll(/```mjs\n([\s\S]*?)```/g)].map((m) => m[1]!);
  assert.equal(blocks.length, 1, 'docs/observability.md has one ```mjs block (the OpenTelemetry example)');
  // Inside the package directory 'udskit' resolves to this package and @opentelemetry/* to its dev dependencies.
  const file = path.join(pkgDir, 'dist-test', 'otel-example.mjs');
  fs.writeFileSync(file, blocks[0]!);
  const dir = tmpDir();
  const out = await new Promise<string>((resolve, reject) => {
    execFile(process.execPath, [file, dir], { cwd: pkgDir, timeout: 60_000 }, (err, stdout, stderr) => {
      if (err) reject(new Error(`${err.message}\n${stderr}`));
      else resolve(stdout);
    });
  });
  const [first, ...lines] = out.trim().split('\n');
  assert.deepEqual(JSON.parse(first!), { user: 42, name: 'ada' });
  const spans = lines.map((l) => {
    const m = /^([0-9a-f]{32}) ([0-9a-f]{16}) parent (\S+) (\w+) (\S+)$/.exec(l);
    assert.ok(m, l);
    return { trace: m[1]!, id: m[2]!, parent: m[3]!, kind: m[4]!, name: m[5]! };
  });
  assert.equal(spans.length, 5, out);
  assert.equal(new Set(spans.map((s) => s.trace)).size, 1, 'one trace');
  const find = (kind: string, name: string) => {
    const s = spans.find((x) => x.kind === kind && x.name === name);
    assert.ok(s, `${kind} ${name} in\n${out}`);
    return s;
  };
  const root = find('INTERNAL', 'request');
  const cl = find('CLIENT', 'lookup');
  const sl = find('SERVER', 'lookup');
  const cp = find('CLIENT', 'profile');
  const sp = find('SERVER', 'profile');
  assert.equal(root.parent, '-');
  assert.equal(cl.parent, root.id);
  assert.equal(sl.parent, cl.id, 'the server continued the trace its caller sent');
  assert.equal(cp.parent, sl.id, "the handler's call is a child of its server span");
  assert.equal(sp.parent, cp.id);
});
