// The README's client-streams example runs as pasted (importing 'udskit' by name).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { pkgDir } from './helpers.js';

test('README client-streams example runs as pasted', async () => {
  const md = fs.readFileSync(path.join(pkgDir, 'README.md'), 'utf8');
  const m = /## Client streams and bidirectional calls\n\n```js\n([\s\S]*?)```/.exec(md);
  assert.ok(m, 'README has the section with a ```js example');
  const file = path.join(pkgDir, 'dist-test', 'readme-bidi-example.mjs');
  fs.writeFileSync(file, m[1]!);
  const r = await new Promise<{ code: number; stdout: string; stderr: string }>((resolve) => {
    execFile(process.execPath, [file], { cwd: pkgDir, timeout: 30_000 }, (err, stdout, stderr) => {
      resolve({ code: err ? (err as { code?: number }).code ?? 1 : 0, stdout, stderr });
    });
  });
  assert.equal(r.code, 0, r.stderr);
  assert.deepEqual(r.stdout.trim().split('\n'), ['total 1', 'total 3', 'total 6', 'count 5']);
});
