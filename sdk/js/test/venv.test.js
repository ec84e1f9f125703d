'use strict';
// Without the repository's Python virtualenv the client's tests cannot start the service: they
// fail saying how to make it, not with a spawn error.

const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { test } = require('node:test');

const { requireVenv } = require('./support/service');

test('a missing .venv fails with the command that makes it', () => {
  const root = fs.mkdtempSync(path.join(os.tmpdir(), 'intentgate-novenv-'));
  try {
    const command = 'python3.11 -m venv .venv && .venv/bin/pip install -r requirements-dev.txt';
    assert.throws(() => requireVenv(root), (error) => error.message.includes(command)
      && error.message.includes(path.join(root, '.venv')));
  } finally {
    fs.rmSync(root, { recursive: true, force: true });
  }
});

test('the repository\'s .venv is there', () => {
  assert.doesNotThrow(() => requireVenv());
});
