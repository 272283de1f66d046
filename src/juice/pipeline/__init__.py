"""The stages of the paper's pipelines, shared by both tables and by your own data's workflow:
:mod:`juice.pipeline.run` (settings, the shared run context, keys), :mod:`juice.pipeline.domains`
(the parametric direction's domains, filtered for the model) and :mod:`juice.pipeline.stages`
(Stage 1, PH3, tuning, evaluation, each cached). The tables themselves are
:mod:`juice.experiments`.
"""
