// For the tests that run in Node (vitest environment "node") only; not part of the plugin bundle.
// The plugin toolchain's Vite configuration maps `fs`, `path`, ... to browser stand-ins, so these
// tests take Node's own modules from the running Node.js.
type Builtin = (id: string) => any;
const builtin: Builtin = (globalThis as any).process.getBuiltinModule;

export const fs: typeof import('fs') = builtin('fs');
export const path: typeof import('path') = builtin('path');
export const os: typeof import('os') = builtin('os');
export const crypto: typeof import('crypto') = builtin('crypto');
export const childProcess: typeof import('child_process') = builtin('child_process');
