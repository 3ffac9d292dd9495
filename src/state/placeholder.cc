// Placeholder so the library has a translation unit; remove once real sources exist.
