// Certificates for the tls: tests, made with the openssl CLI in a temp dir.
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { tmpDir } from './helpers.js';

const dir = tmpDir();

function openssl(...args: string[]): void {
  execFileSync('openssl', args, { stdio: ['ignore', 'ignore', 'pipe'] });
}

/** A CA in dir/NAME-ca.pem, and issue() for leaves signed by it. */
export function makeCA(name: string): { ca: string; issue: (leaf: string, san: string) => { cert: string; key: string } } {
  const ca = path.join(dir, `${name}-ca.pem`);
  const caKey = path.join(dir, `${name}-ca-key.pem`);
  openssl('req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-days', '2',
    '-subj', `/CN=${name}`, '-keyout', caKey, '-out', ca);
  return {
    ca,
    issue(leaf, san) {
      const key = path.join(dir, `${leaf}-key.pem`);
      const csr = path.join(dir, `${leaf}.csr`);
      const cert = path.join(dir, `${leaf}.pem`);
      const ext = path.join(dir, `${leaf}.ext`);
      fs.writeFileSync(ext, `subjectAltName=${san}\nextendedKeyUsage=serverAuth,clientAuth\n`);
      openssl('req', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-subj', `/CN=${leaf}`, '-keyout', key, '-out', csr);
      openssl('x509', '-req', '-in', csr, '-CA', ca, '-CAkey', caKey, '-CAcreateserial', '-days', '1', '-extfile', ext, '-out', cert);
      return { cert, key };
    },
  };
}

