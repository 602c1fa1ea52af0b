"""Site configuration: the pydantic model admins write (``model``) and the
compiled, standard-library-only form the step start path reads (``compiled``)."""
