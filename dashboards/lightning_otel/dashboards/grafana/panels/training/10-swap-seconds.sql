-- Title: Hot-swap seconds
-- Visualization: trend
-- Columns: step, swap_seconds
-- X: step
-- Unit: s
-- Width: 12
-- Description: Seconds the hot-swap of each step's new weights into vLLM took.
SELECT step, swap_seconds
FROM train_steps
WHERE $__timeFilter(time)
ORDER BY step
