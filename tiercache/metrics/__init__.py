"""Node metrics: each process's counters published beside its tier, folded into node totals."""
