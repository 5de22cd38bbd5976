"""The tests' helpers: real servers, clients, processes and figures, in one place."""
