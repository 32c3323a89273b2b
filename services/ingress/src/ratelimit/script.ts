/**
 * The Redis side of the sliding-window counter: one atomic Lua script per request, so the
 * processes of one ingress server can share a bucket without ever over-admitting (Redis runs a
 * script to completion before any other command).
 *
 * KEYS[1]  the bucket (a hash: k = window index of c, c = count of window k, p = count of k−1)
 * ARGV[1]  capacity L
 * ARGV[2]  window W in ms
 * ARGV[3]  '' to use Redis' own clock (TIME), or a time in ms (test clocks only)
 *
 * Time comes from Redis `TIME`, so the clocks of the ingress processes do not matter. Since
 * Redis 5 scripts replicate their effects rather than their source, so a non-deterministic
 * command before a write is allowed; `redis.replicate_commands()` makes that explicit on older
 * servers (on 7 it is a no-op, hence pcall).
 *
 * The decision is window.ts' `viewAt` + `admits`, cross-multiplied in integers (see there).
 * Denied requests write nothing. The first admitted request of a window stores the rolled-forward
 * state and sets the key to expire 2·W later: the counts of window k are needed until the end of
 * window k+1, which is at most 2·W after any moment of window k, after which the key vanishes by
 * itself. Later admitted requests of the same window only increment `c` (HINCRBY): the expiry set
 * at the window's first write already covers them, so the common case is one read and one write.
 *
 * Returns {admitted (1/0), P, C, e, ahead} as seen before this request; the caller derives the
 * Retry-After from them with window.ts' `retryAfterMs`, so that formula exists once.
 */
export const SLIDING_WINDOW_LUA = `
if redis.replicate_commands then pcall(redis.replicate_commands) end
local L = tonumber(ARGV[1])
local W = tonumber(ARGV[2])
local now
if ARGV[3] ~= '' then
  now = tonumber(ARGV[3])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
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
  return {1, p, c, e, ahead}
end
return {0, p, c, e, ahead}
`;
