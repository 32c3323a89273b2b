import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const LIFECYCLE = fileURLToPath(new URL('./lifecycle.ts', import.meta.url));

/**
 * A child with an IPC channel that calls stopWithParent (with a stop that exits 3) either at once
 * or only after its channel has closed, and says 'ready' when it has; `exits` is its exit code.
 * The real services are covered end to end by test/e2e/parent-gone.e2e.test.ts.
 */
function child(registerAfterDisconnect: boolean) {
  const script = `
    const { stopWithParent } = await import(${JSON.stringify(LIFECYCLE)});
    const register = () => stopWithParent(() => process.exit(3));
    if (${registerAfterDisconnect}) process.once('disconnect', () => setTimeout(register, 50));
    else register();
    process.send('ready');
    setTimeout(() => process.exit(0), 20_000);`;
  const c = spawn(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
  const exits = new Promise<number | null>((resolve) => c.once('exit', (code) => resolve(code)));
  const ready = new Promise<void>((resolve) => c.once('message', () => resolve()));
  return { c, exits, ready };
}

describe('stopWithParent', () => {
  it.each([
    ['runs stop when the channel to the parent closes', false],
    ['runs stop at once when the channel closed before it was called (during start-up)', true],
  ])('%s', async (_, registerAfterDisconnect) => {
    const { c, exits, ready } = child(registerAfterDisconnect);
    await ready;
    c.disconnect();
    expect(await exits).toBe(3);
  }, 30_000);
});
