-- Title: Mean reward per policy version
-- Visualization: barchart
-- Columns: version, mean_reward
-- X: version
-- Width: 12
-- Description: Mean reward of the rollouts each policy version served, for rollouts started in the time range (rollouts view; only rollouts served by one version: a rollout that straddles a hot-swap belongs to neither).
-- Versions sort numerically when they are numbers (1, 2, 10), by name otherwise.
SELECT policy_versions[1] AS version, avg(reward) AS mean_reward
FROM rollouts
WHERE reward IS NOT NULL AND len(policy_versions) = 1
  AND $__timeFilter(start_time)
GROUP BY 1
ORDER BY TRY_CAST(version AS BIGINT) NULLS LAST, version
