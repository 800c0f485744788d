"""What a CronJob asks for: its cronlock.io/* annotations parsed and checked once per
version (config, reading, policies, invalid), its schedule, and where its pod template is
(podspec)."""
