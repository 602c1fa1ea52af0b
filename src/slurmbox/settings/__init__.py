"""Settings: the site configuration's pydantic model admins write (``model``), its
compiled, standard-library-only form the step start path reads (``compiled``), the
files rendered from it (``render``) and the shim's plugstack.conf line (``plugstack``)."""
