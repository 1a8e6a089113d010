// npm's "prepare" step: builds dist/ (ESM, CommonJS and .d.ts) so that
// `npm install <path to clients/node>` (a symlink to this directory) and `npm pack`
// get a working package. In a fresh clone the build tools (devDependencies, pinned by
// package-lock.json) are not installed yet: install them first, scripts off.
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const dir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const npm = process.platform === 'win32' ? 'npm.cmd' : 'npm';
const run = (args) => execFileSync(npm, args, { cwd: dir, stdio: ['ignore', 'inherit', 'inherit'] });

if (!fs.existsSync(path.join(dir, 'node_modules', 'typescript', 'package.json'))) {
  console.error('udskit: building dist/ needs the build tools (devDependencies): npm ci in ' + dir);
  run(['ci', '--ignore-scripts', '--no-audit', '--no-fund']);
}
run(['run', 'build']);
