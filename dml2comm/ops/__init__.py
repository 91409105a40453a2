"""Op cost rules.  Importing this package registers every family module with the registry."""
