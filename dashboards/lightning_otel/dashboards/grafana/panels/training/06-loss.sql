-- Title: Loss
-- Visualization: trend
-- Columns: step, loss
-- X: step
-- Unit: none
-- Width: 8
-- Description: Training loss of each optimizer step (PPO-clip objective, plus the KL term when on).
SELECT step, loss
FROM train_steps
WHERE $__timeFilter(time)
ORDER BY step
