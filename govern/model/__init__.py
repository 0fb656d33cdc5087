"""The model: the expression language, variables and the state space, declarations as plain data.

Layer 1: what a machine *is*, before anything is checked (docs/semantics.md gives its one meaning).
May import: govern._errors.
"""
