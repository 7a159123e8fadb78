-- Title: Entropy
-- Visualization: trend
-- Columns: step, entropy
-- X: step
-- Unit: none
-- Width: 8
-- Description: Mean per-token entropy of the policy over the generated tokens of each optimizer step.
SELECT step, entropy
FROM train_steps
WHERE $__timeFilter(time)
ORDER BY step
