/** The CSI driver's name: the CSIDriver object, a PersistentVolume's spec.csi.driver, and the events' reporting component. */
export const DRIVER_NAME = "git.liken.sh";
