"""The paper's experiments as resumable stages: Table 1 (:mod:`.table1`, ParaConflict, the
parametric direction) and Table 2 (:mod:`.table2`, MemoTrap and NQ-Swap, the contextual one), and
a sweep of them over models and directions as Ray tasks (:mod:`.sweep`, `juice sweep`)."""
