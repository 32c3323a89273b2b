/**
 * Stops this process when the one that started it is gone. A service started with an IPC channel
 * (by `npm start`'s scripts/start.ts, or a test harness) runs `stop`, its SIGTERM shutdown, once
 * that channel closes: the parent exited or was killed, SIGKILL included, which gives it no chance
 * to stop its children. So no ingress, worker, control plane or agent outlives the process that
 * started it, holding its ports and connections. A service started without one (a container,
 * systemd, a shell) is unaffected.
 *
 * Called once the service is up: a channel that closed while it was starting (its 'disconnect'
 * came before anyone listened) stops it at once.
 */
export function stopWithParent(stop: () => void): void {
  if (!process.send) return;
  if (!process.connected) {
    setImmediate(stop);
    return;
  }
  process.once('disconnect', stop);
}
