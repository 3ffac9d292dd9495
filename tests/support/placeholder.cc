// Placeholder so the support library has a translation unit.
