"use strict";
// STAND-IN behaviour "runaway" (program side only): a program whose deploy() allocates memory
// without bound and never returns, the way a program stuck in a loop over a growing structure
// does (e2e/tools/pulumi/NOTES.md saw node grow to ~3.4 GB). The operator caps the program's node
// heap (`--program-heap-limit`, `NODE_OPTIONS=--max-old-space-size`), so V8 stops it with its
// fatal "JavaScript heap out of memory" error; the test then sees `ProgramOutOfMemory` and a
// controller that carries on.

/** Everything allocated so far: kept reachable, so the garbage collector can free none of it. */
const kept = [];

/** Allocates ordinary (not large-object) arrays of about half a KiB each, for ever. */
function allocateWithoutBound() {
  console.log("stand-in runaway: deploy() allocates memory without bound");
  for (let i = 0; ; i++) {
    kept.push(new Array(64).fill(i));
  }
}

module.exports = { allocateWithoutBound };
