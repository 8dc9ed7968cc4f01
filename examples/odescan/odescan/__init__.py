"""odescan: a parameter scan of the Lotka-Volterra equations with SciPy's ODE solvers."""
