-- Title: Dropped spans (agent SDK)
-- Visualization: stat
-- Columns: dropped_spans
-- Unit: short
-- Width: 4
-- Description: Spans the agents' SDKs dropped because their export queue was full: per process (resource service.instance.id), the latest cumulative count reported on a rollout root span in the time range, summed over processes.
-- The attribute is cumulative per process, so the latest value per process (not a sum over spans) is what
-- that process lost; processes are told apart by service.instance.id, which the SDK sets once per process.
WITH per_process AS (
    SELECT resource_attributes['service.instance.id'] AS instance,
           arg_max(TRY_CAST(attributes['lightning.sdk.dropped_spans'] AS BIGINT), end_time) AS dropped
    FROM spans
    WHERE is_rollout_root
      AND attributes['lightning.sdk.dropped_spans'] IS NOT NULL
      AND $__timeFilter(start_time)
    GROUP BY 1
)
SELECT coalesce(sum(dropped), 0)::BIGINT AS dropped_spans
FROM per_process
