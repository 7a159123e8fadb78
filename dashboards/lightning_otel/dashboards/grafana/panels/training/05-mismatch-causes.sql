-- Title: Merge mismatch causes
-- Visualization: piechart
-- Columns: cause, boundaries
-- Width: 8
-- Description: Why boundaries did not merge, as classified by the trainer: retokenized, template_changed, context_rewritten, system_prompt_changed, completion_rewritten, unknown (docs/training.md).
SELECT cause, count(*) AS boundaries
FROM merge_diagnostics
WHERE NOT merged AND $__timeFilter(time)
GROUP BY cause
ORDER BY boundaries DESC, cause
