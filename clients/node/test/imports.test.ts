// The seams (issue 24.5): no import cycle among src/*.ts (type-only imports
// count too: a connection knows its client or server only through the narrow
// host interface it declares).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { pkgDir } from './helpers.js';

/** The local imports of each module: `from './x.js'` (import, import type, export ... from) and import('./x.js'). */
export function importGraph(files: Map<string, string>): Map<string, string[]> {
  const g = new Map<string, string[]>();
  const re = /(?:\bfrom\s*|\bimport\s*\(\s*|\bimport\s+)['"]\.\/([\w.-]+?)(?:\.js)?['"]/g;
  for (const [name, text] of files) {
    const deps = new Set<string>();
    for (const m of text.matchAll(re)) deps.add(m[1]!);
    g.set(name, [...deps].sort());
  }
  return g;
}

/** One cycle as a path [a, b, ..., a], or null. */
export function findCycle(g: Map<string, string[]>): string[] | null {
  const state = new Map<string, 1 | 2>(); // 1 on the stack, 2 done
  const stack: string[] = [];
  const visit = (n: string): string[] | null => {
    state.set(n, 1);
    stack.push(n);
    for (const d of g.get(n) ?? []) {
      if (state.get(d) === 1) return [...stack.slice(stack.indexOf(d)), d];
      if (state.get(d) === undefined) {
        const c = visit(d);
        if (c !== null) return c;
      }
    }
    stack.pop();
    state.set(n, 2);
    return null;
  };
  for (const n of [...g.keys()].sort()) {
    if (state.get(n) === undefined) {
      const c = visit(n);
      if (c !== null) return c;
    }
  }
  return null;
}

test('the cycle finder finds cycles, type-only imports included, and passes a DAG', () => {
  const files = new Map([
    ['a', "import { b } from './b.js';\nexport const a = 1;"],
    ['b', "import type { C } from './c.js';\nexport { x } from './d.js';"],
    ['c', "import { a } from './a.js';"],
    ['d', "const m = await import('./e.js');"],
    ['e', ''],
  ]);
  const g = importGraph(files);
  assert.deepEqual(g.get('b'), ['c', 'd']);
  assert.deepEqual(g.get('d'), ['e']);
  assert.deepEqual(findCycle(g), ['a', 'b', 'c', 'a']);
  files.set('c', '');
  assert.equal(findCycle(importGraph(files)), null);
});

test('no import cycle among src/*.ts', () => {
  const src = path.join(pkgDir, 'src');
  const files = new Map<string, string>();
  for (const f of fs.readdirSync(src)) {
    if (f.endsWith('.ts')) files.set(f.slice(0, -3), fs.readFileSync(path.join(src, f), 'utf8'));
  }
  assert.ok(files.size > 10, `read ${files.size} modules`);
  const g = importGraph(files);
  for (const [name, deps] of g) for (const d of deps) assert.ok(files.has(d), `${name} imports ./${d}.js, which is not in src`);
  const cycle = findCycle(g);
  assert.equal(cycle, null, `import cycle: ${cycle?.join(' -> ')}`);
});
