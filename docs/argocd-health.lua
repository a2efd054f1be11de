-- Argo CD health check for platform.di-framework.dev/PlatformInstance: the key
-- resource.customizations.health.platform.di-framework.dev_PlatformInstance of argocd-cm.
-- Suspended=True -> Suspended; Stalled=True -> Degraded; Ready=True -> Healthy; anything
-- else (the controller has not seen the latest spec, or Reconciling=True) -> Progressing.
local hs = {}
local function condition(type)
  if obj.status == nil or obj.status.conditions == nil then
    return nil
  end
  for _, c in ipairs(obj.status.conditions) do
    if c.type == type and c.status == "True" then
      return c
    end
  end
  return nil
end
local generation = obj.metadata.generation
if obj.status == nil or obj.status.observedGeneration == nil
    or (generation ~= nil and obj.status.observedGeneration < generation) then
  hs.status = "Progressing"
  hs.message = "waiting for the platform operator to act on the latest spec"
  return hs
end
local suspended = condition("Suspended")
local stalled = condition("Stalled")
local ready = condition("Ready")
local reconciling = condition("Reconciling")
if suspended ~= nil then
  hs.status = "Suspended"
  hs.message = suspended.message
elseif stalled ~= nil then
  hs.status = "Degraded"
  hs.message = stalled.reason .. ": " .. stalled.message
elseif ready ~= nil then
  hs.status = "Healthy"
  hs.message = ready.message
else
  hs.status = "Progressing"
  hs.message = reconciling ~= nil and reconciling.message or "waiting for the platform operator"
end
return hs
