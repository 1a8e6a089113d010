// Marks dist/cjs (the CommonJS build, tsconfig.cjs.json) as CommonJS: the package
// itself is "type": "module", so without this Node would load dist/cjs/*.js as ESM.
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
const dir = path.join(path.dirname(fileURLToPath(import.meta.url)), '..', 'dist', 'cjs');
fs.mkdirSync(dir, { recursive: true });
fs.writeFileSync(path.join(dir, 'package.json'), '{\n  "type": "commonjs"\n}\n');
