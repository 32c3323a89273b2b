/**
 * The Redis side of the limiter: one atomic Lua script per request, so the processes of one
 * ingress server can share a bucket without ever over-admitting (Redis runs a script to completion
 * before any other command). It has two modes, chosen per bucket by the caller (redis.ts: capacity
 * ≤ `exactMax` is the log), each on its own key (keys.ts), since their types differ:
 *
 * KEYS[1]  the bucket: a list (log mode) or a hash (counter mode)
 * ARGV[1]  capacity L
 * ARGV[2]  window W in ms
 * ARGV[3]  '' to use Redis' own clock (TIME), or a time in ms (test clocks only)
 * ARGV[4]  '1': exact sliding log; anything else ('0'): the two-counter estimate
 *
 * Requires Redis ≥ 5: scripts replicate their effects rather than their source (the default
 * since 5, the only mode since 7), so a non-deterministic command (TIME) before a write is
 * allowed without `redis.replicate_commands()`. Time comes from Redis `TIME`, so the clocks of
 * the ingress processes do not matter.
 *
 * Log mode (window.ts' `ExactLog`): the list holds the admission times (ms) of the most recent
 * admitted requests, newest first, at most L of them. A request is admitted iff the list holds
 * fewer than L entries or its L-th entry (index L−1) is ≤ now − W, i.e. fewer than L admissions
 * lie in the rolling window (now − W, now]. An admission pushes its time (the head's if the clock
 * stepped back below it, so the list stays sorted), trims the list to L (RPOP, or LTRIM after a
 * capacity decrease) and sets the key to expire when its newest entry leaves the window (W after
 * it, counted from now). Memory per key: ≤ L entries of ~10 bytes (integers in a listpack).
 *
 * Counter mode (window.ts' `viewAt` + `admits`, cross-multiplied in integers, see there): the hash
 * has k = window index of c, c = count of window k, p = count of k−1. The first admitted request
 * of a window stores the rolled-forward state and sets the key to expire 2·W later: the counts of
 * window k are needed until the end of window k+1, which is at most 2·W after any moment of
 * window k, after which the key vanishes by itself. Later admitted requests of the same window
 * only increment `c` (HINCRBY): the expiry set at the window's first write already covers them,
 * so the common case is one read and one write.
 *
 * Denied requests write nothing in either mode. An admitted request gets the integer 1 (the
 * common answer, kept short: Redis builds and sends one integer instead of a five-element array,
 * ~10 % of the script's cost, and the ingress parses one integer). A denied one gets five
 * non-negative integers, as seen before this request:
 * - log mode:     {0, ms until a request would be admitted, 0, 0, 0}
 * - counter mode: {0, P, C, e, ahead}; the caller derives the Retry-After from them with
 *   window.ts' `retryAfterMs`, so that formula exists once.
 */
export const SLIDING_WINDOW_LUA = `
local L = tonumber(ARGV[1])
local W = tonumber(ARGV[2])
local now
if ARGV[3] ~= '' then
  now = tonumber(ARGV[3])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
if ARGV[4] == '1' then
  local o = tonumber(redis.call('LINDEX', KEYS[1], L - 1))
  if o and o > now - W then
    return {0, o + W - now, 0, 0, 0}
  end
  local t = tonumber(redis.call('LINDEX', KEYS[1], 0))
  if not t or t < now then
    t = now
  end
  local n = redis.call('LPUSH', KEYS[1], t)
  if n == L + 1 then
    redis.call('RPOP', KEYS[1])
  elseif n > L then
    redis.call('LTRIM', KEYS[1], 0, L - 1)
  end
  redis.call('PEXPIRE', KEYS[1], t - now + W)
  return 1
end
local k = math.floor(now / W)
local e = now - k * W
local ahead = 0
local h = redis.call('HMGET', KEYS[1], 'k', 'c', 'p')
local sk = tonumber(h[1])
local c = tonumber(h[2]) or 0
local p = tonumber(h[3]) or 0
local same = sk == k
if sk == nil or sk < k - 1 then
  c = 0
  p = 0
elseif sk == k - 1 then
  p = c
  c = 0
elseif sk > k then
  -- the clock stepped back: read the stored (later) window from its start, the strictest reading
  ahead = sk * W - now
  k = sk
  e = 0
  same = true
end
if p * (W - e) <= (L - 1 - c) * W then
  if same then
    redis.call('HINCRBY', KEYS[1], 'c', 1)
  else
    redis.call('HSET', KEYS[1], 'k', k, 'c', c + 1, 'p', p)
    redis.call('PEXPIRE', KEYS[1], 2 * W)
  end
  return 1
end
return {0, p, c, e, ahead}
`;
