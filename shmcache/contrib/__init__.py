"""Thin adapters of shmcache to other libraries, over its public API only. Each module imports its library; this
package imports nothing."""
