-- Argo CD health of a batch/CronJob, aware of cronlock (docs/USAGE.md, GitOps). Set it as
-- resource.customizations.health.batch_CronJob in argocd-cm (argocd-cm-patch.yaml here).
--
-- A run that skipped because another run held its lock did what cronlock asked of it,
-- yet its Job failed (FailJob), so the CronJob's last success is older than its last
-- schedule, which Argo CD's built-in check calls Degraded. Here a guarded CronJob whose
-- runs since its last success were all such skips (the operator counts them in
-- cronlock.io/consecutive-skips, reset by a success) stays Healthy until the count
-- reaches its cronlock.io/alert-after (default 3), when cronlock also posts RepeatedSkips:
-- then it is Degraded, because a lock held that long may hide a stuck run. Every other
-- CronJob is judged as Argo CD's built-in check judges it.
local hs = {}
local metadata = obj.metadata or {}
local annotations = metadata.annotations or {}
local status = obj.status or {}

if obj.spec ~= nil and obj.spec.suspend == true then
  hs.status = "Healthy"
  hs.message = "CronJob is Suspended"
  return hs
end

if annotations["cronlock.io/enabled"] == "true" then
  local skips = tonumber(annotations["cronlock.io/consecutive-skips"] or "0") or 0
  if skips > 0 then
    local limit = tonumber(annotations["cronlock.io/alert-after"] or "") or 3
    if skips >= limit then
      hs.status = "Degraded"
      hs.message = skips .. " runs in a row skipped because their lock stayed held (RepeatedSkips): `cronlock status` shows the holder"
    else
      hs.status = "Healthy"
      hs.message = skips .. " runs in a row skipped because another run held the lock; Degraded at " .. limit
    end
    return hs
  end
end

if obj.status == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the CronJob controller"
  return hs
end
if status.lastScheduleTime == nil then
  hs.status = "Healthy"
  hs.message = "CronJob has not been scheduled yet"
  return hs
end
if status.lastSuccessfulTime == nil then
  -- Not known yet whether the first run will succeed.
  hs.status = "Healthy"
  hs.message = "No run has succeeded yet"
  return hs
end
if status.active ~= nil and #status.active > 0 then
  hs.status = "Healthy"
  hs.message = "A run is in progress"
  return hs
end
-- RFC 3339 timestamps in UTC compare as strings.
if status.lastSuccessfulTime < status.lastScheduleTime then
  hs.status = "Degraded"
  hs.message = "The last scheduled run did not succeed"
  return hs
end
hs.status = "Healthy"
hs.message = "The last scheduled run succeeded"
return hs
