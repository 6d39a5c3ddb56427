"""Paper A (Hidden Heroes and Gradient Bloats): scores and roles, tables, the protocol
grid and its tables and figures, claim spread. Beside workflow/rules/heroes.smk and
heroes_grid.smk. Kept free of imports so that ``grid`` stays importable without torch.
"""
