-- Title: Mean reward per train step
-- Visualization: trend
-- Columns: step, mean_reward
-- X: step
-- Width: 12
-- Description: Mean reward of the rollouts each optimizer step trained on (train_steps), for the steps made in the time range.
SELECT step, mean_reward
FROM train_steps
WHERE $__timeFilter(time)
ORDER BY step
