import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { overflowKey } from '@warren/shared';
import { ScriptedTargets, bufferLength, envelope, startHarness, waitFor, type Harness } from './testing.js';
import { makeBatches, scheduleBackoff, toRecord } from './flush.js';
import { runAdmin } from './admin.js';

/** The flush job's outcome table against a scripted in-memory target (real Redis, Postgres, BullMQ). */

const targets = new ScriptedTargets();
let h: Harness;

beforeAll(async () => {
  h = await startHarness({ createTarget: targets.factory, retryScheduleMs: [100, 150, 200], autoPauseAfterMs: 3_600_000 });
});
afterAll(async () => {
  await h?.close();
});

const range = (from: number, n: number, prefix = 'ev') => Array.from({ length: n }, (_, i) => `${prefix}_${String(from + i).padStart(6, '0')}`);
const events = (ids: string[]) => ids.map((id) => envelope(id));

/** Failed attempts of each flush job of a destination (BullMQ also counts the completing attempt). */
async function attemptsOf(destId: string): Promise<number[]> {
  const jobs = (await h.service.queue('datadog').getJobs(['completed', 'failed', 'delayed', 'active', 'waiting'])).filter((j) => j.data.destId === destId);
  return Promise.all(jobs.map(async (j) => j.attemptsMade - ((await j.isCompleted()) ? 1 : 0)));
}

describe('flush job', () => {
  it('delivers every event once, in order, in calls within the limits', async () => {
    const d = await h.addDestination('datadog', { api_key: 'k' });
    const ids = range(0, 1250);
    for (let i = 0; i < ids.length; i += 50) await h.publish(d, 'datadog', events(ids.slice(i, i + 50)));
    await waitFor('all delivered', () => targets.ids(d).length >= ids.length);
    await h.waitDrained();
    expect(targets.ids(d)).toEqual(ids);
    expect(Math.max(...targets.calls.get(d)!)).toBeLessThanOrEqual(100);
    expect(await bufferLength(h, d)).toBe(0);
    const m = await h.service.metrics.registry.getSingleMetricAsString('warren_events_delivered_total');
    expect(m).toContain('kind="datadog"} 1250');
    // Completed jobs (kept an hour) hold no event bodies.
    const completed = await h.service.queue('datadog').getCompleted(0, 1000);
    expect(completed.length).toBeGreaterThan(0);
    for (const j of completed) expect(j.data.pending ?? []).toEqual([]);
  });

  it('partial failure: resends only the failed records', async () => {
    const d = await h.addDestination('datadog', { api_key: 'k' });
    targets.script(d, { kind: 'done', retry: [1, 3], dead: [] });
    const ids = range(0, 6);
    await h.publish(d, 'datadog', events(ids));
    await waitFor('all delivered', () => targets.ids(d).length >= 6);
    await h.waitDrained();
    expect([...targets.ids(d)].sort()).toEqual(ids);
    expect(targets.calls.get(d)).toEqual([6, 2]);
  });

  it('retries a failed call on the schedule, then succeeds', async () => {
    const d = await h.addDestination('datadog', { api_key: 'k' });
    targets.script(d, { kind: 'retry', reason: 'HTTP 500', unknownOutcome: false }, { kind: 'retry', reason: 'HTTP 503', unknownOutcome: false });
    const ids = range(0, 3);
    await h.publish(d, 'datadog', events(ids));
    await waitFor('delivered', () => targets.ids(d).length >= 3, 10_000);
    await h.waitDrained();
    expect(targets.ids(d)).toEqual(ids);
    expect(await h.deadLetters(d)).toEqual([]);
    expect((await h.health(d))?.failing_since).toBeNull();
  });

  it('throttled: waits at least Retry-After without using an attempt while another destination flows', async () => {
    const slow = await h.addDestination('datadog', { api_key: 'k' });
    const other = await h.addDestination('datadog', { api_key: 'k' });
    // slow is held for RETRY_AFTER_MS after its call (after t0); other is delivered within that
    // hold: it did not wait for slow (a pause of the whole queue, or a shared job, would hold it
    // as long; other arriving before slow would not show that, as both would resume together).
    // The hold is long enough that other's publish → BullMQ → target chain fits on a loaded machine.
    const RETRY_AFTER_MS = 5000;
    targets.script(slow, { kind: 'throttled', retryAfterMs: RETRY_AFTER_MS, reason: 'HTTP 429' });
    const t0 = Date.now();
    await h.publish(slow, 'datadog', events(range(0, 2)));
    await waitFor('throttled call', () => (targets.calls.get(slow)?.length ?? 0) >= 1);
    await h.publish(other, 'datadog', events(range(100, 2)));
    await waitFor('other delivered', () => targets.ids(other).length >= 2);
    const otherMs = Date.now() - t0;
    console.log(`throttled (Retry-After ${RETRY_AFTER_MS} ms): the other destination delivered ${otherMs} ms after the first publish`);
    expect(otherMs).toBeLessThan(RETRY_AFTER_MS);
    expect(targets.ids(slow)).toEqual([]);
    await waitFor('throttled delivered', () => targets.ids(slow).length >= 2, RETRY_AFTER_MS + 10_000);
    expect(Date.now() - t0).toBeGreaterThanOrEqual(RETRY_AFTER_MS);
    await h.waitDrained();
    expect(await attemptsOf(slow)).toEqual([0]);
  });

  it('too large: splits the call in halves; one record still too large is dead-lettered', async () => {
    const d = await h.addDestination('datadog', { api_key: 'k' });
    const ids = range(0, 8);
    const poison = ids[5]!;
    targets.script(d, (recs) => (recs.length > 1 || recs[0]!.eventId === poison ? { kind: 'too_large', reason: 'HTTP 413' } : { kind: 'done', retry: [], dead: [] }));
    // 8 → 4+4 → … every multi-record call is too large: 7 single records get through, the poison one is dead.
    for (let i = 0; i < 20; i++)
      targets.script(d, (recs) => (recs.length > 1 || recs[0]!.eventId === poison ? { kind: 'too_large', reason: 'HTTP 413' } : { kind: 'done', retry: [], dead: [] }));
    await h.publish(d, 'datadog', events(ids));
    await waitFor('dead letter', async () => (await h.deadLetters(d)).length > 0);
    await h.waitDrained();
    expect(targets.ids(d)).toEqual(ids.filter((x) => x !== poison));
    const dl = await h.deadLetters(d);
    expect(dl).toHaveLength(1);
    expect(dl[0]!.reason).toMatch(/^record_too_large/);
    expect(dl[0]!.event_ids).toEqual([poison]);
    expect(await attemptsOf(d)).toEqual([0]);
  });

  it('a record above the per-record limit goes to the dead letters without a call', async () => {
    const d = await h.addDestination('datadog', { api_key: 'k' });
    const big = envelope('ev_big', { pad: 20_000 });
    await h.publish(d, 'datadog', [envelope('ev_a'), big, envelope('ev_b'), 'not json']);
    await waitFor('delivered', () => targets.ids(d).length >= 2);
    await h.waitDrained();
    expect(targets.ids(d)).toEqual(['ev_a', 'ev_b']);
    const dl = await h.deadLetters(d);
    expect(dl.map((r) => r.reason.split(':')[0]).sort()).toEqual(['invalid_envelope', 'record_too_large']);
    const tooLarge = dl.find((r) => r.reason.startsWith('record_too_large'))!;
    expect(tooLarge.event_ids).toEqual(['ev_big']);
    expect((tooLarge.payload[0] as { event_id: string }).event_id).toBe('ev_big');
  });

  it('rejected and per-record final errors go to the dead letters with the reason', async () => {
    const d = await h.addDestination('datadog', { api_key: 'k' });
    targets.script(d, { kind: 'done', retry: [], dead: [{ index: 0, reason: 'KMSDisabledException: key disabled' }] }, { kind: 'rejected', reason: 'HTTP 400: bad' });
    await h.publish(d, 'datadog', events(range(0, 2)));
    await waitFor('first call', () => targets.ids(d).length >= 1);
    await h.publish(d, 'datadog', events(range(10, 2)));
    await waitFor('dead letters', async () => (await h.deadLetters(d)).length >= 2);
    await h.waitDrained();
    const dl = await h.deadLetters(d);
    expect(dl.map((r) => [r.reason, r.event_ids])).toEqual([
      ['record_failed: KMSDisabledException: key disabled', ['ev_000000']],
      ['rejected: HTTP 400: bad', ['ev_000010', 'ev_000011']],
    ]);
  });

  it('auth failure pauses the destination, keeps its events in order, burns no attempt; an update resumes it', async () => {
    const d = await h.addDestination('datadog', { api_key: 'bad' });
    targets.script(d, { kind: 'auth', reason: 'HTTP 403' });
    const ids = range(0, 5);
    await h.publish(d, 'datadog', events(ids));
    await waitFor('paused', async () => (await h.health(d))?.paused);
    expect((await h.health(d))?.reason).toBe('HTTP 403');
    // More events keep buffering while paused; nothing is sent.
    await h.publish(d, 'datadog', events(range(5, 3)));
    await h.waitDrained();
    expect(targets.calls.get(d)).toEqual([5]);
    expect(await bufferLength(h, d)).toBe(8);
    expect((await h.redis.lrange(`${h.prefix}:evbuf:${d}`, 0, -1)).map((b) => toRecord(b)!.eventId)).toEqual(range(0, 8));
    expect((await attemptsOf(d)).every((a) => a === 0)).toBe(true);
    await h.updateDestination(d, { api_key: 'good' });
    await waitFor('delivered after update', () => targets.ids(d).length >= 8);
    await h.waitDrained();
    expect(targets.ids(d)).toEqual(range(0, 8));
    expect((await h.health(d))?.paused).toBe(false);
  });

  it('the probe resumes a paused destination; a second auth failure pauses it again', async () => {
    const d = await h.addDestination('datadog', { api_key: 'bad' });
    targets.script(d, { kind: 'auth', reason: 'HTTP 401' }, { kind: 'auth', reason: 'HTTP 401 again' });
    await h.publish(d, 'datadog', events(range(0, 2)));
    await waitFor('paused', async () => (await h.health(d))?.paused);
    await h.pool.query(`UPDATE event_destination_health SET paused_at = now() - interval '1 hour' WHERE destination_id = $1`, [d]);
    expect(await h.service.probe()).toBeGreaterThanOrEqual(1);
    await waitFor('paused again', async () => (await h.health(d))?.reason === 'HTTP 401 again');
    await h.pool.query(`UPDATE event_destination_health SET paused_at = now() - interval '1 hour' WHERE destination_id = $1`, [d]);
    await h.service.probe();
    await waitFor('delivered', () => targets.ids(d).length >= 2);
    expect((await h.health(d))?.paused).toBe(false);
  });

  it('exhausted schedule: the records go to the dead letters and later events still flow', async () => {
    const d = await h.addDestination('datadog', { api_key: 'k' });
    for (let i = 0; i < 4; i++) targets.script(d, { kind: 'retry', reason: `HTTP 500 #${i}`, unknownOutcome: false });
    await h.publish(d, 'datadog', events(range(0, 3)));
    await waitFor('dead letters', async () => (await h.deadLetters(d)).length > 0, 10_000);
    const dl = await h.deadLetters(d);
    expect(dl[0]!.reason).toBe('exhausted: 4 attempts: HTTP 500 #3');
    expect(dl[0]!.event_ids).toEqual(range(0, 3));
    expect(targets.calls.get(d)).toEqual([3, 3, 3, 3]);
    await h.publish(d, 'datadog', events(range(10, 2)));
    await waitFor('later events', () => targets.ids(d).length >= 2);
    await h.waitDrained();
  });

  it('admin CLI: lists dead letters and replays them into the buffer', async () => {
    const d = await h.addDestination('datadog', { api_key: 'k' });
    for (let i = 0; i < 4; i++) targets.script(d, { kind: 'retry', reason: 'HTTP 502', unknownOutcome: false });
    await h.publish(d, 'datadog', events(range(0, 3)));
    await waitFor('dead letters', async () => (await h.deadLetters(d)).length > 0, 10_000);
    const out: string[] = [];
    const deps = { pool: h.pool, producer: h.service.producer, out: (l: string) => out.push(l) };
    expect(await runAdmin(['list', '--destination', d], deps)).toBe(0);
    expect(out).toHaveLength(1);
    const row = JSON.parse(out[0]!) as { id: number; reason: string; events: number };
    expect(row).toMatchObject({ reason: 'exhausted: 4 attempts: HTTP 502', events: 3 });
    expect(await runAdmin(['replay', String(row.id)], deps)).toBe(0);
    expect(out.at(-1)).toBe('replayed 3 events from 1 dead letters');
    await waitFor('replayed', () => targets.ids(d).length >= 3);
    expect(targets.ids(d)).toEqual(range(0, 3));
    expect(await h.deadLetters(d)).toEqual([]);
    expect(await runAdmin(['replay', '--destination', d], deps)).toBe(1);
    await expect(runAdmin(['replay'], deps)).rejects.toThrow(/dead-letter id/);
  });

  it('auto-pauses a destination failing continuously for AUTO_PAUSE_AFTER_MS', async () => {
    const d = await h.addDestination('datadog', { api_key: 'k' });
    await h.pool.query(`INSERT INTO event_destination_health (destination_id, failing_since) VALUES ($1, now() - interval '2 hours')`, [d]);
    targets.script(d, { kind: 'retry', reason: 'HTTP 500', unknownOutcome: false });
    await h.publish(d, 'datadog', events(range(0, 2)));
    await waitFor('paused', async () => (await h.health(d))?.paused);
    expect((await h.health(d))?.reason).toMatch(/^failing since .*: HTTP 500$/);
    expect(await bufferLength(h, d)).toBe(2);
    expect(await h.service.metrics.registry.getSingleMetricAsString('warren_event_destinations_auto_paused_total')).toContain('kind="datadog"} 1');
  });

  it('a deleted destination: its buffer goes to the dead letters', async () => {
    const d = await h.addDestination('datadog', { api_key: 'k' });
    targets.script(d, { kind: 'auth', reason: 'HTTP 403' });
    await h.publish(d, 'datadog', events(range(0, 3)));
    await waitFor('paused', async () => (await h.health(d))?.paused);
    await h.deleteDestination(d);
    await h.service.sweep();
    const dl = await h.deadLetters(d);
    expect(dl.map((r) => r.reason)).toEqual(['destination_deleted']);
    expect(dl[0]!.event_ids).toEqual(range(0, 3));
    expect(await bufferLength(h, d)).toBe(0);
  });

  it('a flush job for a deleted destination dead-letters its events and fails for good', async () => {
    const d = await h.addDestination('datadog', { api_key: 'k' });
    await h.pool.query('DELETE FROM event_destinations WHERE id = $1', [d]);
    await h.publish(d, 'datadog', events(range(0, 2)));
    await waitFor('dead letters', async () => (await h.deadLetters(d)).length > 0);
    await h.waitDrained();
    expect((await h.deadLetters(d)).map((r) => [r.reason, r.event_ids])).toEqual([['destination_deleted', range(0, 2)]]);
    const failed = (await h.service.queue('datadog').getFailed()).filter((j) => j.data.destId === d);
    expect(failed.map((j) => [j.failedReason, j.data.pending])).toEqual([[`destination ${d} no longer exists`, undefined]]);
  });

  it('overflow (buffer full) goes to the dead letters as buffer_full', async () => {
    const d = await h.addDestination('datadog', { api_key: 'k' });
    await h.redis.rpush(overflowKey(h.prefix, d), envelope('ev_over1'), envelope('ev_over2'));
    await h.publish(d, 'datadog', events(range(0, 1)));
    await waitFor('dead letter', async () => (await h.deadLetters(d)).length > 0);
    await h.waitDrained();
    expect((await h.deadLetters(d)).map((r) => [r.reason, r.event_ids])).toEqual([['buffer_full', ['ev_over1', 'ev_over2']]]);
  });

  it('the sweep adds a flush job for a buffer nobody scheduled', async () => {
    const d = await h.addDestination('datadog', { api_key: 'k' });
    await h.redis.rpush(`${h.prefix}:evbuf:${d}`, ...events(range(0, 3)));
    await h.service.sweep();
    await waitFor('delivered', () => targets.ids(d).length >= 3);
  });

  it('keeps credentials out of Redis', async () => {
    const d = await h.addDestination('datadog', { api_key: 'SUPERSECRET_dd_key_123' });
    targets.script(d, { kind: 'throttled', retryAfterMs: 60_000, reason: 'HTTP 429' });
    await h.publish(d, 'datadog', events(range(0, 2)));
    await waitFor('throttled', () => (targets.calls.get(d)?.length ?? 0) >= 1);
    const dump = await h.dumpRedis();
    expect(dump).toContain(d);
    expect(dump).not.toContain('SUPERSECRET');
  });
});

describe('batching', () => {
  const t = { kind: 'cloudwatch_logs' as const, limits: { maxRecords: 3, maxBatchBytes: 1_000, maxRecordBytes: 500, overheadBytes: 26 }, recordBytes: (r: { body: string }) => r.body.length + 26 };
  const rec = (id: string, ts: number, size = 10) => ({ eventId: id, body: 'x'.repeat(size), timestamp: ts });
  it('CloudWatch: drops out-of-range times, sorts, splits at count, bytes and 24 h spans', () => {
    const now = Date.UTC(2026, 0, 20);
    const h = 3_600_000;
    const { batches, dead } = makeBatches(
      [rec('old', now - 15 * 24 * h), rec('b', now - 30 * h), rec('a', now - 40 * h), rec('c', now - 1 * h), rec('future', now + 3 * h), rec('big', now, 600), rec('d', now), rec('e', now), rec('f', now), rec('g', now, 460), rec('i', now, 460)],
      t,
      now,
    );
    expect(batches.map((b) => b.map((r) => r.eventId))).toEqual([['a', 'b'], ['c', 'd', 'e'], ['f', 'g'], ['i']]);
    expect(dead.map((x) => [x.reason, x.records.map((r) => r.eventId)])).toEqual([
      ['record_too_large', ['big']],
      ['timestamp_out_of_range', ['old', 'future']],
    ]);
  });
  it('backoff follows the schedule with ±20 % jitter', () => {
    for (let i = 0; i < 50; i++) {
      const b = scheduleBackoff([5_000, 30_000], 1);
      expect(b).toBeGreaterThanOrEqual(4_000);
      expect(b).toBeLessThanOrEqual(6_000);
      const last = scheduleBackoff([5_000, 30_000], 7);
      expect(last).toBeGreaterThanOrEqual(24_000);
      expect(last).toBeLessThanOrEqual(36_000);
    }
  });
});
