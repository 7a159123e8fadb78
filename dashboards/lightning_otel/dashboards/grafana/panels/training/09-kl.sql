-- Title: KL to reference
-- Visualization: trend
-- Columns: step, kl
-- X: step
-- Unit: none
-- Width: 12
-- Description: Mean per-token k3 KL divergence from the frozen reference policy, per optimizer step (0 or empty when kl_coef is off).
SELECT step, kl
FROM train_steps
WHERE $__timeFilter(time)
ORDER BY step
