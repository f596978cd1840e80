"""Running an experiment, above everything else: the command line, the run config, the cells
of the grid and the function that computes one (`harness`), the writer and the run folder.

Nothing below this package imports it.
"""
