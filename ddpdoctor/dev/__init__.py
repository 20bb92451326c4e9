"""Development tools shipped with the package: docgen regenerates the docs tables from the registries."""
